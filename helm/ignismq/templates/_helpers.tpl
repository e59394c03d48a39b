{{/* Names ------------------------------------------------------------------------------------------ */}}
{{- define "ignismq.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "ignismq.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "ignismq.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* A component's object name: <fullname>-<component> (the 63-character limit of DNS labels). */}}
{{- define "ignismq.componentName" -}}
{{- printf "%s-%s" (include "ignismq.fullname" .root) .component | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Cluster-scoped objects (ClusterRole, ClusterRoleBinding) also carry the release namespace: two
releases of one name in two namespaces must not fight over them. */}}
{{- define "ignismq.clusterObjectName" -}}
{{- printf "%s-%s-%s" .root.Release.Namespace (include "ignismq.fullname" .root) .component | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels: the recommended app.kubernetes.io set on every object, plus commonLabels. */}}
{{- define "ignismq.labels" -}}
helm.sh/chart: {{ include "ignismq.chart" . }}
app.kubernetes.io/name: {{ include "ignismq.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: ignismq
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "ignismq.componentLabels" -}}
{{ include "ignismq.labels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* Selector labels: stable across upgrades (never the version or commonLabels). */}}
{{- define "ignismq.selectorLabels" -}}
app.kubernetes.io/name: {{ include "ignismq.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "ignismq.serviceAccountName" -}}
{{- $sa := index .root.Values .component "serviceAccount" -}}
{{- if $sa.create -}}
{{- default (include "ignismq.componentName" .) $sa.name -}}
{{- else -}}
{{- default "default" $sa.name -}}
{{- end -}}
{{- end -}}

{{/* The image: a digest pins it (and wins over the tag); the tag defaults to the chart's appVersion. */}}
{{- define "ignismq.image" -}}
{{- $image := .Values.image -}}
{{- if $image.digest -}}
{{- printf "%s@%s" $image.repository $image.digest -}}
{{- else -}}
{{- printf "%s:%s" $image.repository (default .Chart.AppVersion $image.tag) -}}
{{- end -}}
{{- end -}}

{{- define "ignismq.configName" -}}
{{- printf "%s-config" (include "ignismq.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Store wiring shared by every IgnisMQ container: the non-secret settings from the ConfigMap, the
credentials from the user's Secret (never from values), the TLS files from a Secret volume. */}}
{{- define "ignismq.storeEnv" -}}
{{- with .Values.store.existingSecret }}
- name: IGNIS_AEROSPIKE_USER
  valueFrom:
    secretKeyRef:
      name: {{ . }}
      key: {{ $.Values.store.userKey }}
- name: IGNIS_AEROSPIKE_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ . }}
      key: {{ $.Values.store.passwordKey }}
{{- end }}
{{- end -}}

{{- define "ignismq.storeVolumeMounts" -}}
- name: tmp
  mountPath: /tmp
{{- if .Values.store.tls.secretName }}
- name: store-tls
  mountPath: /etc/ignis/tls
  readOnly: true
{{- end }}
{{- end -}}

{{- define "ignismq.storeVolumes" -}}
- name: tmp
  emptyDir:
    sizeLimit: {{ .Values.tmpSizeLimit }}
{{- if .Values.store.tls.secretName }}
- name: store-tls
  secret:
    secretName: {{ .Values.store.tls.secretName }}
    defaultMode: 0440
{{- end }}
{{- end -}}

{{/* Pod-level fields every IgnisMQ pod shares; `component` values may override scheduling knobs. */}}
{{- define "ignismq.podCommon" -}}
{{- $c := index .root.Values .component -}}
{{- with .root.Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
securityContext:
  {{- toYaml .root.Values.podSecurityContext | nindent 2 }}
{{- with (default .root.Values.priorityClassName $c.priorityClassName) }}
priorityClassName: {{ . }}
{{- end }}
{{- with (default .root.Values.nodeSelector $c.nodeSelector) }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with (default .root.Values.tolerations $c.tolerations) }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with (default .root.Values.affinity $c.affinity) }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{- define "ignismq.podAnnotations" -}}
{{- $c := index .root.Values .component -}}
checksum/config: {{ include (print .root.Template.BasePath "/configmap.yaml") .root | sha256sum }}
{{- with .root.Values.podAnnotations }}
{{ toYaml . }}
{{- end }}
{{- with $c.podAnnotations }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "ignismq.podLabels" -}}
{{ include "ignismq.componentLabels" . }}
{{- with .root.Values.podLabels }}
{{ toYaml . }}
{{- end }}
{{- with (index .root.Values .component).podLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "ignismq.watchNamespaces" -}}
{{- join "," .Values.operator.watchNamespaces -}}
{{- end -}}
