{{/* Chart name, overridable. */}}
{{- define "ferry-edge.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Fully qualified name of the release's objects. Kept at 50 characters so that
suffixed names (-metrics, -leader-election, ...) stay within 63.
*/}}
{{- define "ferry-edge.fullname" -}}
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

{{- define "ferry-edge.selectorLabels" -}}
app.kubernetes.io/name: {{ include "ferry-edge.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "ferry-edge.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "ferry-edge.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: ferry
{{- end }}

{{- define "ferry-edge.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "ferry-edge.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "ferry-edge.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* --agent-name: a DNS label. */}}
{{- define "ferry-edge.agentName" -}}
{{- default (.Release.Name | replace "." "-" | trunc 63 | trimSuffix "-") .Values.agentName }}
{{- end }}

{{/* The Secret holding the client certificate. */}}
{{- define "ferry-edge.tlsSecretName" -}}
{{- if .Values.certManager.enabled }}
{{- printf "%s-tls" (include "ferry-edge.fullname" .) }}
{{- else }}
{{- required "set tls.existingSecret (a Secret with the edge's tls.crt and tls.key) or certManager.enabled=true" .Values.tls.existingSecret }}
{{- end }}
{{- end }}

{{/* The Secret holding the broker's CA bundle. */}}
{{- define "ferry-edge.brokerCASecretName" -}}
{{- default (include "ferry-edge.tlsSecretName" .) .Values.tls.brokerCA.existingSecret }}
{{- end }}

{{/* The Secret an enrolled edge keeps its credentials in. */}}
{{- define "ferry-edge.credentialsSecretName" -}}
{{- default (printf "%s-credentials" (include "ferry-edge.fullname" .)) .Values.enrolment.credentialsSecret }}
{{- end }}

{{/* Checks across values that the schema cannot express. */}}
{{- define "ferry-edge.validate" -}}
{{- if eq (int .Values.metrics.port) (int .Values.health.port) }}
{{- if .Values.metrics.enabled }}
{{- fail (printf "metrics.port and health.port must differ (both are %v)" .Values.health.port) }}
{{- end }}
{{- end }}
{{- if and (gt (int .Values.replicaCount) 1) (not .Values.leaderElection.enabled) }}
{{- fail "replicaCount above 1 needs leaderElection.enabled: without it every replica would connect to the broker" }}
{{- end }}
{{- if and .Values.enrolment.enabled .Values.certManager.enabled }}
{{- fail "enrolment.enabled and certManager.enabled exclude each other: an enrolled edge gets its certificate from the broker" }}
{{- end }}
{{- if .Values.certManager.enabled }}
{{- if not .Values.certManager.issuerRef.name }}
{{- fail "certManager.enabled needs certManager.issuerRef.name: an issuer in this cluster that chains to the CA the broker trusts" }}
{{- end }}
{{- if not .Values.certManager.identity }}
{{- fail "certManager.enabled needs certManager.identity: the edge's identity in the broker's configuration (the certificate's URI SAN)" }}
{{- end }}
{{- end }}
{{- end }}
