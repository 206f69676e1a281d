{{/* Chart name, overridable. */}}
{{- define "ferry-broker.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Fully qualified name of the release's objects. Kept at 50 characters so that
suffixed names (-metrics, -client-<name>, ...) stay within 63.
*/}}
{{- define "ferry-broker.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 50 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 50 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 50 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "ferry-broker.selectorLabels" -}}
app.kubernetes.io/name: {{ include "ferry-broker.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "ferry-broker.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "ferry-broker.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: ferry
{{- end }}

{{- define "ferry-broker.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "ferry-broker.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "ferry-broker.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* The ConfigMap holding config.yaml. */}}
{{- define "ferry-broker.configMapName" -}}
{{- default (printf "%s-config" (include "ferry-broker.fullname" .)) .Values.config.existingConfigMap }}
{{- end }}

{{/* The Secret holding the kcp kubeconfig. */}}
{{- define "ferry-broker.kcpSecretName" -}}
{{- if .Values.kcp.kubeconfig }}
{{- printf "%s-kcp" (include "ferry-broker.fullname" .) }}
{{- else }}
{{- required "set kcp.kubeconfig (the kubeconfig's content) or kcp.existingSecret (the name of a Secret holding it under kcp.secretKey)" .Values.kcp.existingSecret }}
{{- end }}
{{- end }}

{{/* The Secret holding the server certificate. */}}
{{- define "ferry-broker.tlsSecretName" -}}
{{- if .Values.certManager.enabled }}
{{- printf "%s-tls" (include "ferry-broker.fullname" .) }}
{{- else }}
{{- required "set tls.existingSecret (a kubernetes.io/tls Secret with the server certificate) or certManager.enabled=true" .Values.tls.existingSecret }}
{{- end }}
{{- end }}

{{/* The Secret holding the client CA bundle. */}}
{{- define "ferry-broker.clientCASecretName" -}}
{{- default (include "ferry-broker.tlsSecretName" .) .Values.tls.clientCA.existingSecret }}
{{- end }}

{{/* The issuer of the chart's certificates. */}}
{{- define "ferry-broker.issuerRef" -}}
{{- if .Values.certManager.issuerRef.name -}}
name: {{ .Values.certManager.issuerRef.name }}
kind: {{ .Values.certManager.issuerRef.kind }}
group: {{ .Values.certManager.issuerRef.group }}
{{- else -}}
name: {{ include "ferry-broker.fullname" . }}-ca
kind: Issuer
group: cert-manager.io
{{- end }}
{{- end }}

{{/* Ports must differ: the pod listens on all three. */}}
{{- define "ferry-broker.checkPorts" -}}
{{- $ports := list (int .Values.grpc.port) (int .Values.health.port) }}
{{- if .Values.metrics.enabled }}{{ $ports = append $ports (int .Values.metrics.port) }}{{ end }}
{{- if ne (len $ports) (len (uniq $ports)) }}
{{- fail (printf "grpc.port (%v), metrics.port (%v) and health.port (%v) must differ" .Values.grpc.port .Values.metrics.port .Values.health.port) }}
{{- end }}
{{- end }}

{{/* The broker's --config file. */}}
{{- define "ferry-broker.config" -}}
{{- $cfg := dict "edges" .Values.config.edges }}
{{- if .Values.config.admins }}{{ $_ := set $cfg "admins" .Values.config.admins }}{{ end }}
{{- toYaml $cfg }}
{{- end }}
