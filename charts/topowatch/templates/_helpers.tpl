{{/* Base name of every object: the release name, unless it already says topowatch. */}}
{{- define "topowatch.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 50 | trimSuffix "-" -}}
{{- else if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "topowatch.nodeAgent.name" -}}{{ include "topowatch.fullname" . }}-node-agent{{- end -}}
{{- define "topowatch.cluster.name" -}}{{ include "topowatch.fullname" . }}-cluster{{- end -}}

{{- define "topowatch.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* Selector labels of one component; pass (dict "root" $ "component" "node-agent"). */}}
{{- define "topowatch.selectorLabels" -}}
app.kubernetes.io/name: {{ .root.Chart.Name }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "topowatch.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}

{{/* The hardened container securityContext both components share. */}}
{{- define "topowatch.containerSecurityContext" -}}
allowPrivilegeEscalation: false
privileged: false
readOnlyRootFilesystem: true
capabilities:
  drop: ["ALL"]
{{- end -}}

{{/* Pod securityContext; pass (dict "root" $ "runAsRoot" bool "supplementalGroups" list),
and "fsGroup" int where the pod writes a volume: the kubelet makes the volume's files group-
owned by it and group-writable, so the non-root user can write them (OnRootMismatch: only when
the volume's root is not already so, not a recursive walk of a large volume on every start). */}}
{{- define "topowatch.podSecurityContext" -}}
{{- if .runAsRoot }}
runAsNonRoot: false
runAsUser: 0
runAsGroup: 0
{{- else }}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
{{- end }}
{{- with .supplementalGroups }}
supplementalGroups:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- if hasKey . "fsGroup" }}
fsGroup: {{ .fsGroup }}
fsGroupChangePolicy: OnRootMismatch
{{- end }}
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* The cluster service's history store: "sqlite" (a file on a volume), "postgresql" (a URL
from a Secret), or "" (history.enabled false). */}}
{{- define "topowatch.history.store" -}}
{{- if .Values.history.enabled -}}
{{- if .Values.history.postgresql.existingSecret -}}postgresql{{- else -}}sqlite{{- end -}}
{{- end -}}
{{- end -}}

{{- define "topowatch.history.claimName" -}}
{{- .Values.history.persistence.existingClaim | default (printf "%s-history" (include "topowatch.cluster.name" .)) -}}
{{- end -}}

{{/* Dashboards the chart carries (copied in by scripts/sync_chart_assets.py). */}}
{{- define "topowatch.dashboardFiles" -}}
{{- range $path, $_ := .Files.Glob "dashboards/*.json" }}{{ $path }}
{{ end -}}
{{- end -}}
