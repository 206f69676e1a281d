package framework

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Metrics is one scrape of a ferry process's /metrics.
type Metrics map[string]*dto.MetricFamily

// Scrape reads the metrics p serves (see Process.MetricsAddress).
func Scrape(ctx context.Context, p *Process) (Metrics, error) {
	if p.MetricsAddress == "" {
		return nil, fmt.Errorf("%s serves no metrics", p.Name)
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+p.MetricsAddress+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("scraping %s: %w", p.Name, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(resp.Body)
		return nil, fmt.Errorf("scraping %s: %s: %s", p.Name, resp.Status, body)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("parsing the metrics of %s: %w", p.Name, err)
	}
	return Metrics(families), nil
}

// Value is the value of the series of family name whose labels include
// labels (counter, gauge, or a histogram's sample count), summed over the
// matching series; false when none matches.
func (m Metrics) Value(name string, labels map[string]string) (float64, bool) {
	f, ok := m[name]
	if !ok {
		return 0, false
	}
	sum, found := 0.0, false
	for _, s := range f.GetMetric() {
		if !hasLabels(s, labels) {
			continue
		}
		found = true
		switch {
		case s.GetCounter() != nil:
			sum += s.GetCounter().GetValue()
		case s.GetGauge() != nil:
			sum += s.GetGauge().GetValue()
		case s.GetHistogram() != nil:
			sum += float64(s.GetHistogram().GetSampleCount())
		case s.GetUntyped() != nil:
			sum += s.GetUntyped().GetValue()
		}
	}
	return sum, found
}

// Buckets is the cumulative count per upper bound of the histogram series
// of name whose labels include labels (the first matching series).
func (m Metrics) Buckets(name string, labels map[string]string) map[float64]uint64 {
	f, ok := m[name]
	if !ok {
		return nil
	}
	for _, s := range f.GetMetric() {
		if h := s.GetHistogram(); h != nil && hasLabels(s, labels) {
			out := map[float64]uint64{}
			for _, b := range h.GetBucket() {
				out[b.GetUpperBound()] = b.GetCumulativeCount()
			}
			return out
		}
	}
	return nil
}

func hasLabels(s *dto.Metric, want map[string]string) bool {
	n := 0
	for _, l := range s.GetLabel() {
		if v, ok := want[l.GetName()]; ok {
			if v != l.GetValue() {
				return false
			}
			n++
		}
	}
	return n == len(want)
}

// Probe returns the HTTP status and body of p's health endpoint path
// ("/readyz", "/healthz").
func Probe(ctx context.Context, p *Process, path string) (int, string, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+p.HealthAddress+path, nil)
	if err != nil {
		return 0, "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), err
}
