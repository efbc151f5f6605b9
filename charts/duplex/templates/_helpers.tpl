{{/* Names, labels and the operator's command line, shared by the templates. */}}

{{- define "duplex.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "duplex.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains (include "duplex.name" .) .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name (include "duplex.name" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "duplex.selectorLabels" -}}
app.kubernetes.io/name: {{ include "duplex.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "duplex.labels" -}}
{{ include "duplex.selectorLabels" . }}
app.kubernetes.io/part-of: duplex
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "duplex.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "duplex.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "duplex.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{/* The operator's rules: the `rules` of files/clusterrole.yaml, the one list (never retyped here). */}}
{{- define "duplex.rules" -}}
{{- $role := .Files.Get "files/clusterrole.yaml" | fromYaml -}}
{{- required "files/clusterrole.yaml has no rules" $role.rules | toYaml -}}
{{- end -}}

{{/* The rules of that list about cluster-scoped resources only (kopf discovers CRDs and follows namespaces):
granted cluster-wide in namespaced mode, so that the operator reads what it must without holding anything
cluster-wide on workloads. Picked from the one list by resource, never retyped. */}}
{{- define "duplex.clusterScopedRules" -}}
{{- $role := .Files.Get "files/clusterrole.yaml" | fromYaml -}}
{{- $picked := list -}}
{{- range $rule := $role.rules -}}
{{- $clusterScoped := true -}}
{{- range $resource := $rule.resources -}}
{{- if not (has $resource (list "customresourcedefinitions" "namespaces")) -}}{{- $clusterScoped = false -}}{{- end -}}
{{- end -}}
{{- if $clusterScoped -}}{{- $picked = append $picked $rule -}}{{- end -}}
{{- end -}}
{{- toYaml $picked -}}
{{- end -}}

{{/* `duplex operator` flags: the watched scope, the ports the probes and scrapers use, the resync interval. */}}
{{- define "duplex.operatorArgs" -}}
{{- if .Values.watchNamespaces }}
{{- range .Values.watchNamespaces }}
- --namespace
- {{ . | quote }}
{{- end }}
{{- else }}
- --all-namespaces
{{- end }}
- --metrics-port
- {{ .Values.operator.metricsPort | quote }}
- --health-port
- {{ .Values.operator.healthPort | quote }}
{{- if .Values.operator.resyncSeconds }}
- --resync-seconds
- {{ .Values.operator.resyncSeconds | quote }}
{{- end }}
{{- if .Values.operator.workers }}
- --workers
- {{ .Values.operator.workers | quote }}
{{- end }}
{{- if .Values.policy.allowPrivilegedEFA }}
- --allow-privileged-efa
{{- end }}
{{- range .Values.policy.allowedHostPathPrefixes }}
- --allow-host-path
- {{ . | quote }}
{{- end }}
{{- range .Values.policy.allowedImagePrefixes }}
- --allow-image
- {{ . | quote }}
{{- end }}
{{- range .Values.policy.allowedSecrets }}
- --allow-secret
- {{ . | quote }}
{{- end }}
{{- range .Values.policy.allowedTolerationKeys }}
- --allow-toleration
- {{ . | quote }}
{{- end }}
{{- if .Values.operator.verbose }}
- --verbose
{{- end }}
{{- end -}}

{{/* Namespace selector of the PodMonitors: the watched namespaces, or all. */}}
{{- define "duplex.monitoredNamespaces" -}}
{{- if .Values.watchNamespaces }}
matchNames:
{{- range .Values.watchNamespaces }}
  - {{ . | quote }}
{{- end }}
{{- else }}
any: true
{{- end }}
{{- end -}}
