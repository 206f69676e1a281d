package main

import (
	"github.com/ferry-dev/ferry/test/benchreport"
	"github.com/ferry-dev/ferry/test/framework"
)

// refusalMetric counts the broker's refused handshakes by reason.
const refusalMetric = "ferry_broker_handshake_refusals_total"

// refusalsDelta is after's refusals less before's, by reason (before nil:
// from zero), leaving out reasons that did not grow.
func refusalsDelta(before, after framework.Metrics) map[string]float64 {
	out := map[string]float64{}
	for reason, n := range refusals(after) {
		if d := n - refusals(before)[reason]; d > 0 {
			out[reason] = d
		}
	}
	return out
}

func refusals(m framework.Metrics) map[string]float64 {
	out := map[string]float64{}
	f, ok := m[refusalMetric]
	if !ok {
		return out
	}
	for _, s := range f.GetMetric() {
		for _, l := range s.GetLabel() {
			if l.GetName() == "reason" {
				out[l.GetValue()] += s.GetCounter().GetValue()
			}
		}
	}
	return out
}

// kcpRequestsMetric counts the broker's requests to kcp (watches count
// once, when they start).
const kcpRequestsMetric = "ferry_client_requests_total"

// kcpRequests is the broker's requests to kcp so far (0 without a scrape).
func kcpRequests(m framework.Metrics) float64 {
	v, _ := m.Value(kcpRequestsMetric, map[string]string{"cluster": "kcp"})
	return v
}

// readCPU is the CPU seconds process pid has used.
func readCPU(pid int) (float64, error) {
	u, err := benchreport.ReadUsage(pid)
	return u.CPUSeconds, err
}
