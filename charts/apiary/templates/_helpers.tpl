{{- define "apiary.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "apiary.labels" -}}
app.kubernetes.io/name: apiary
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "apiary.selectorLabels" -}}
app.kubernetes.io/name: apiary
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "apiary.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{- define "apiary.webhookService" -}}{{ include "apiary.fullname" . }}-webhook{{- end -}}
{{- define "apiary.webhookSecret" -}}{{ include "apiary.fullname" . }}-webhook-cert{{- end -}}
{{- define "apiary.mutatingName" -}}{{ include "apiary.fullname" . }}-mutating{{- end -}}
{{- define "apiary.validatingName" -}}{{ include "apiary.fullname" . }}-validating{{- end -}}

{{- /* key=value,... of a map, sorted (an operator flag). */ -}}
{{- define "apiary.labelList" -}}
{{- $out := list -}}
{{- range $k, $v := . }}{{ $out = append $out (printf "%s=%s" $k $v) }}{{ end -}}
{{- join "," $out -}}
{{- end -}}

{{/*
apiary.scopedRules keeps, of each generated rule, the resources that are
cluster-wide (cluster=true: cluster-scoped ones, and Apiary's own kinds) or
namespaced (cluster=false); rules left without resources are dropped.
*/}}
{{- define "apiary.scopedRules" -}}
{{- /* Apiary's own namespaced kinds stay cluster-wide too: deleting a
namespace deletes its Roles as early as anything else, and the operator
must still remove its finalizers from the tenants and Hosts there. */ -}}
{{- $clusterScoped := list "namespaces" "nodes" "datastores" "datastores/status" "datastores/finalizers" "servicecidrs" "tokenreviews" "subjectaccessreviews" "tenantcontrolplanes" "tenantcontrolplanes/status" "tenantcontrolplanes/finalizers" "hosts" "hosts/status" "hosts/finalizers" -}}
{{- $out := list -}}
{{- range .rules -}}
{{- $keep := list -}}
{{- range .resources -}}
{{- if eq (has . $clusterScoped) $.cluster -}}
{{- $keep = append $keep . -}}
{{- end -}}
{{- end -}}
{{- if $keep -}}
{{- $r := deepCopy . -}}
{{- $_ := set $r "resources" $keep -}}
{{- $out = append $out $r -}}
{{- end -}}
{{- end -}}
{{- toYaml $out -}}
{{- end -}}

{{- define "apiary.dashboardSelectorLabels" -}}
app.kubernetes.io/name: apiary
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: dashboard
{{- end -}}
