{{/*
Names. Every object is named after the release (its "fullname": the release name, or
"<release>-confighash" when the release name does not contain "confighash"), so a release of any
name works in any namespace. A release named "confighash" in the namespace "confighash" gets
exactly the names of deploy/.
*/}}

{{- define "confighash.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "confighash.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* "<fullname>-<suffix>", within the 63 characters of a Service or label value. */}}
{{- define "confighash.suffixed" -}}
{{- $suffix := index . 1 }}
{{- printf "%s-%s" (include "confighash.fullname" (index . 0) | trunc (int (sub 62 (len $suffix))) | trimSuffix "-") $suffix }}
{{- end }}

{{/* The names `confighash serve` is told (--key-secret, --certs-secret, --lease, ...). */}}
{{- define "confighash.keySecret" -}}
{{- include "confighash.suffixed" (list . "key") }}
{{- end }}

{{- define "confighash.certsSecret" -}}
{{- include "confighash.suffixed" (list . "certs") }}
{{- end }}

{{/* cert-manager's Secret holding the serving pair. */}}
{{- define "confighash.tlsSecret" -}}
{{- include "confighash.suffixed" (list . "tls") }}
{{- end }}

{{- define "confighash.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The labels pods are selected by. Never change them: a Deployment's selector is immutable. */}}
{{- define "confighash.selectorLabels" -}}
app.kubernetes.io/name: {{ include "confighash.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "confighash.labels" -}}
{{ include "confighash.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | trunc 63 | trimSuffix "-" | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ include "confighash.chart" . }}
{{- end }}

{{- define "confighash.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}
{{- end }}

{{- define "confighash.selfSigned" -}}
{{- if eq .Values.certificates.mode "selfSigned" }}true{{ end }}
{{- end }}

{{/*
A duration of the form the schema allows ("1500ms", "2s", "1m30s", "1h") in milliseconds, for the
checks below (Helm has no duration parser).
*/}}
{{- define "confighash.milliseconds" -}}
{{- $total := 0 }}
{{- range regexFindAll "[0-9]+(ms|s|m|h)" . -1 }}
{{- $n := regexFind "^[0-9]+" . | atoi }}
{{- $unit := trimPrefix (regexFind "^[0-9]+" .) . }}
{{- $factor := get (dict "ms" 1 "s" 1000 "m" 60000 "h" 3600000) $unit }}
{{- $total = add $total (mul $n $factor) }}
{{- end }}
{{- $total }}
{{- end }}

{{/*
Checks JSON schema cannot express: lookups share one deadline that must stay well below (at most
half) the webhook's timeoutSeconds, or the API server gives up on reviews that would have been
answered; and a budget that no replica may leave blocks every node drain.
*/}}
{{- define "confighash.validate" -}}
{{- $deadline := include "confighash.milliseconds" (.Values.webhook.lookupDeadline | default "2s") | int }}
{{- $timeout := mul (int .Values.webhook.timeoutSeconds) 1000 }}
{{- if gt (mul $deadline 2) $timeout }}
{{- fail (printf "webhook.lookupDeadline (%s) must be at most half of webhook.timeoutSeconds (%d s): the API server stops waiting after timeoutSeconds" (.Values.webhook.lookupDeadline | default "2s") (int .Values.webhook.timeoutSeconds)) }}
{{- end }}
{{- if and .Values.podDisruptionBudget.enabled (not (kindIs "string" .Values.podDisruptionBudget.minAvailable)) }}
{{- if ge (int .Values.podDisruptionBudget.minAvailable) (int .Values.replicaCount) }}
{{- fail (printf "podDisruptionBudget.minAvailable (%d) must be below replicaCount (%d), or no node that runs a replica could be drained; with one replica set podDisruptionBudget.enabled=false" (int .Values.podDisruptionBudget.minAvailable) (int .Values.replicaCount)) }}
{{- end }}
{{- end }}
{{- range .Values.watchNamespaces }}
{{- if or (eq . "kube-system") (eq . $.Release.Namespace) }}
{{- fail (printf "watchNamespaces may not list %s: confighash never reads or touches kube-system or its own namespace (%s)" . $.Release.Namespace) }}
{{- end }}
{{- end }}
{{- if and (eq .Values.certificates.mode "certManager") .Values.certificates.certManager.issuerRef }}
{{- if not .Values.certificates.certManager.issuerRef.name }}
{{- fail "certificates.certManager.issuerRef needs a name (or leave it empty for the chart's own CA)" }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Where the API server sends reviews: the Service, or webhook.url (development: an API server that
cannot reach Services, such as one without kube-proxy, calls confighash where it runs).
*/}}
{{- define "confighash.webhookClient" -}}
{{- with .Values.webhook.url -}}
url: {{ . | quote }}
{{- else -}}
service:
  name: {{ include "confighash.fullname" . }}
  namespace: {{ .Release.Namespace }}
  port: 443
  path: /mutate
{{- end -}}
{{- end }}
