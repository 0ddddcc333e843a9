{{/* Chart name, truncated to 63 characters (a DNS label). */}}
{{- define "tinyserve.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Fully qualified app name: release-chart unless the release name already holds the chart name. */}}
{{- define "tinyserve.fullname" -}}
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

{{- define "tinyserve.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "tinyserve.routerName" -}}
{{- printf "%s-router" (include "tinyserve.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "tinyserve.workerName" -}}
{{- printf "%s-worker" (include "tinyserve.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels on every object. */}}
{{- define "tinyserve.labels" -}}
helm.sh/chart: {{ include "tinyserve.chart" . }}
{{ include "tinyserve.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "tinyserve.selectorLabels" -}}
app.kubernetes.io/name: {{ include "tinyserve.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "tinyserve.routerSelectorLabels" -}}
{{ include "tinyserve.selectorLabels" . }}
app.kubernetes.io/component: router
{{- end }}

{{- define "tinyserve.workerSelectorLabels" -}}
{{ include "tinyserve.selectorLabels" . }}
app.kubernetes.io/component: worker
{{- end }}

{{- define "tinyserve.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "tinyserve.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* Image reference; the worker uses the -cuda flavour when GPUs are enabled. */}}
{{- define "tinyserve.image" -}}
{{- $tag := default .root.Chart.AppVersion .root.Values.image.tag -}}
{{- if .cuda }}{{ $tag = printf "%s-cuda" $tag }}{{ end -}}
{{ printf "%s:%s" .root.Values.image.repository $tag }}
{{- end }}

{{/* The headless service the router resolves to find workers (one A record per ready pod). */}}
{{- define "tinyserve.workersDNS" -}}
{{- printf "%s.%s.svc.%s:%d" (include "tinyserve.workerName" .) .Release.Namespace .Values.clusterDomain (int .Values.worker.grpcPort) }}
{{- end }}

{{/* Path of the model file inside the worker container. */}}
{{- define "tinyserve.modelPath" -}}
{{- $m := .Values.model -}}
{{- if $m.path }}{{ $m.path }}
{{- else if eq $m.source "baked" }}{{ printf "%s/%s" $m.bakedDir $m.file }}
{{- else }}{{ printf "%s/%s" $m.cacheDir $m.file }}
{{- end }}
{{- end }}

{{/* Native gRPC probe: grpc.health.v1 service name, on the gRPC port, or with TLS on the
plaintext health port (kubelet's gRPC probes cannot speak TLS). */}}
{{- define "tinyserve.grpcProbe" -}}
grpc:
  port: {{ if .root.Values.tls.secretName }}{{ .root.Values.tls.healthPort }}{{ else }}{{ .port }}{{ end }}
  {{- if .service }}
  service: {{ .service | quote }}
  {{- end }}
{{- end }}

{{/* Where the TLS Secret is mounted, and the name the workers' certificate must carry. */}}
{{- define "tinyserve.tlsDir" -}}/etc/tinyserve/tls{{- end }}
{{- define "tinyserve.workerServerName" -}}
{{- default (printf "%s.%s.svc.%s" (include "tinyserve.workerName" .) .Release.Namespace .Values.clusterDomain) .Values.tls.workerServerName }}
{{- end }}

{{/* The TLS Secret as a volume, and its read-only mount. */}}
{{- define "tinyserve.tlsVolume" -}}
- name: tls
  secret:
    secretName: {{ .Values.tls.secretName | quote }}
{{- end }}
{{- define "tinyserve.tlsMount" -}}
- name: tls
  mountPath: {{ include "tinyserve.tlsDir" . }}
  readOnly: true
{{- end }}

{{/* Tracing flags, the same for router and workers. */}}
{{- define "tinyserve.tracingArgs" -}}
{{- if .Values.tracing.otlpEndpoint }}
- --otlp-traces-endpoint={{ .Values.tracing.otlpEndpoint }}
- --trace-sample-ratio={{ .Values.tracing.sampleRatio }}
{{- end }}
{{- end }}

{{/* Refuse to render values that cannot drain cleanly or make no sense together. */}}
{{- define "tinyserve.validate" -}}
{{- $w := .Values.worker -}}
{{- if lt (int $w.terminationGracePeriodSeconds) (add (int $w.preStopSleepSeconds) (int $w.drainTimeoutSeconds)) }}
{{- fail (printf "worker.terminationGracePeriodSeconds (%d) must be >= worker.preStopSleepSeconds (%d) + worker.drainTimeoutSeconds (%d)" (int $w.terminationGracePeriodSeconds) (int $w.preStopSleepSeconds) (int $w.drainTimeoutSeconds)) }}
{{- end }}
{{- if lt (int .Values.router.terminationGracePeriodSeconds) (int .Values.router.preStopSleepSeconds) }}
{{- fail "router.terminationGracePeriodSeconds must be >= router.preStopSleepSeconds" }}
{{- end }}
{{- if and (eq .Values.model.source "pvc") (not .Values.model.existingClaim) }}
{{- fail "model.source=pvc needs model.existingClaim" }}
{{- end }}
{{- if and (gt (int $w.tensorParallelSize) 1) (not $w.gpu.enabled) }}
{{- /* CPU tensor parallelism (Gloo) is allowed; nothing to refuse. */}}
{{- end }}
{{- end }}

{{/* preStop pause: the native sleep action from Kubernetes 1.30 (beta on by default), else exec sleep. */}}
{{- define "tinyserve.preStop" -}}
preStop:
{{- if semverCompare ">=1.30-0" .root.Capabilities.KubeVersion.Version }}
  sleep:
    seconds: {{ .seconds }}
{{- else }}
  exec:
    command: ["/bin/sleep", "{{ .seconds }}"]
{{- end }}
{{- end }}
