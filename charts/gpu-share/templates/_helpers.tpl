{{/*
Helm's standard labels, added to every object beside the ones the kustomize base sets
(app.kubernetes.io/name, part-of, component), which the selectors use and which never change.
*/}}
{{- define "gpu-share.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end }}

{{- define "gpu-share.image" -}}
{{ printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) | quote }}
{{- end }}

{{/* The Secret with tls.crt, tls.key and ca.crt: cert-manager's, or one that exists. */}}
{{- define "gpu-share.tlsSecret" -}}
{{ .Values.certificates.secretName }}
{{- end }}

{{/*
The policy: the values' inline YAML, else the embedded default (files/policy.yaml, a copy of
policies/default.yaml), whose schedulerName follows .Values.schedulerName and whose workloads
are templateChecks.extraKinds.
*/}}
{{- define "gpu-share.policy" -}}
{{- if .Values.policy -}}
{{ .Values.policy }}
{{- else -}}
{{- $policy := .Files.Get "files/policy.yaml" | replace "schedulerName: gpu-share-scheduler" (printf "schedulerName: %s" .Values.schedulerName) -}}
{{- with .Values.templateChecks.extraKinds -}}
{{- $kinds := list -}}
{{- range . -}}
{{- $kinds = append $kinds (dict "group" .group "version" .version "kind" .kind "templates" .templates) -}}
{{- end -}}
{{- $policy = replace "\nworkloads: []\n" (printf "\nworkloads:\n%s\n" (toYaml $kinds | indent 2)) $policy -}}
{{- end -}}
{{ $policy }}
{{- end -}}
{{- end }}

{{/*
The KubeSchedulerConfiguration (files/scheduler-config.yaml, a copy of the base's): its profile
is .Values.schedulerName; its Lease, and the name it verifies the extender's certificate by, in
the release's namespace.
*/}}
{{- define "gpu-share.schedulerConfig" -}}
{{ .Files.Get "files/scheduler-config.yaml" | replace "- schedulerName: gpu-share-scheduler" (printf "- schedulerName: %s" .Values.schedulerName) | replace "resourceNamespace: gpu-share" (printf "resourceNamespace: %s" .Release.Namespace) | replace "gpu-share.gpu-share.svc" (printf "gpu-share.%s.svc" .Release.Namespace) }}
{{- end }}

{{/*
kube-scheduler's tag: the value, else the cluster's version without a platform's suffix
(v1.33.5-eks-113cf36, v1.33.5-gke.1201000 and v1.33.5+k3s1 all give v1.33.5), so the scheduler is
never newer than the API server.
*/}}
{{- define "gpu-share.kubeSchedulerTag" -}}
{{- if .Values.scheduler.kubeScheduler.image.tag -}}
{{ .Values.scheduler.kubeScheduler.image.tag }}
{{- else -}}
{{- $v := semver .Capabilities.KubeVersion.Version -}}
{{ printf "v%d.%d.%d" $v.Major $v.Minor $v.Patch }}
{{- end -}}
{{- end }}
