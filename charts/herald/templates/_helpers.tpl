{{/* The chart name. */}}
{{- define "herald.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The full name: `<release>-herald`, or the release name when it already contains the
chart name. Cluster-scoped objects (ClusterRole, ClusterRoleBinding) are named after it,
so two releases with different names never clash.
*/}}
{{- define "herald.fullname" -}}
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

{{- define "herald.operator.fullname" -}}
{{- printf "%s-operator" (include "herald.fullname" .) }}
{{- end }}

{{- define "herald.dispatcher.fullname" -}}
{{- printf "%s-dispatcher" (include "herald.fullname" .) }}
{{- end }}

{{- define "herald.api.fullname" -}}
{{- printf "%s-api" (include "herald.fullname" .) }}
{{- end }}

{{/* The leader-election Lease, per release so two releases in one namespace do not share it. */}}
{{- define "herald.leaseName" -}}
{{- printf "%s-leader" (include "herald.operator.fullname" .) }}
{{- end }}

{{- define "herald.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "herald.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: herald
{{- end }}

{{- define "herald.selectorLabels" -}}
app.kubernetes.io/name: {{ include "herald.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "herald.operator.selectorLabels" -}}
{{ include "herald.selectorLabels" . }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "herald.dispatcher.selectorLabels" -}}
{{ include "herald.selectorLabels" . }}
app.kubernetes.io/component: dispatcher
{{- end }}

{{- define "herald.api.selectorLabels" -}}
{{ include "herald.selectorLabels" . }}
app.kubernetes.io/component: api
{{- end }}

{{- define "herald.image" -}}
{{- printf "%s/%s:%s" .root.Values.image.repository .name (default .root.Chart.Version .root.Values.image.tag) }}
{{- end }}

{{/* Environment shared by both binaries: NATS, shards, SSRF policy, logs, listen address. */}}
{{- define "herald.commonEnv" -}}
{{- if .Values.nats.existingSecret }}
- name: HERALD_NATS_URL
  valueFrom:
    secretKeyRef:
      name: {{ .Values.nats.existingSecret }}
      key: {{ .Values.nats.existingSecretKey }}
{{- else }}
- name: HERALD_NATS_URL
  value: {{ .Values.nats.url | quote }}
{{- end }}
- name: HERALD_JETSTREAM_REPLICAS
  value: {{ .Values.nats.jetstreamReplicas | quote }}
- name: HERALD_SHARDS
  value: {{ .Values.shards | quote }}
{{- if .Values.allowNetworks }}
- name: HERALD_ALLOW_NETWORKS
  value: {{ join "," .Values.allowNetworks | quote }}
{{- end }}
- name: HERALD_ALLOW_HTTP
  value: {{ .Values.allowHttp | quote }}
- name: HERALD_LISTEN
  value: "0.0.0.0:8080"
{{- end }}

{{/* The namespaces the operator serves, comma-separated (operator.tenantNamespaces and the
deprecated operator.watchNamespace); empty: every namespace. */}}
{{- define "herald.operator.tenantNamespaces" -}}
{{- $tenants := .Values.operator.tenantNamespaces | default list }}
{{- with .Values.operator.watchNamespace }}{{ $tenants = append $tenants . }}{{ end }}
{{- $tenants | uniq | join "," }}
{{- end }}

{{/* NATS TLS and the NATS identity of one binary, from Secrets mounted read-only:
(dict "root" $ "identity" .Values.nats.<binary>Identity "what" "<binary>Identity").
"herald.natsEnv" gives the environment, "herald.natsVolumeMounts" and
"herald.natsVolumes" the mounts (empty when nothing is set). */}}
{{- define "herald.natsEnv" -}}
{{- $root := .root }}
{{- $id := .identity }}
{{- with $root.Values.nats.tls.caSecret }}
- name: HERALD_NATS_TLS_CA
  value: /etc/herald/nats-ca/{{ $root.Values.nats.tls.caFile }}
{{- end }}
{{- if $id.secret }}
{{- if $id.certFile }}
- name: HERALD_NATS_TLS_CERT
  value: /etc/herald/nats-identity/{{ $id.certFile }}
- name: HERALD_NATS_TLS_KEY
  value: /etc/herald/nats-identity/{{ required (printf "nats.%s.keyFile is required with certFile" .what) $id.keyFile }}
{{- end }}
{{- if and $id.credsFile $id.nkeyFile }}
{{- fail (printf "nats.%s: set credsFile or nkeyFile, not both" .what) }}
{{- end }}
{{- with $id.credsFile }}
- name: HERALD_NATS_CREDS
  value: /etc/herald/nats-identity/{{ . }}
{{- end }}
{{- with $id.nkeyFile }}
- name: HERALD_NATS_NKEY
  value: /etc/herald/nats-identity/{{ . }}
{{- end }}
{{- end }}
{{- end }}

{{- define "herald.natsVolumeMounts" -}}
{{- if .root.Values.nats.tls.caSecret }}
- name: nats-ca
  mountPath: /etc/herald/nats-ca
  readOnly: true
{{- end }}
{{- if .identity.secret }}
- name: nats-identity
  mountPath: /etc/herald/nats-identity
  readOnly: true
{{- end }}
{{- end }}

{{- define "herald.natsVolumes" -}}
{{- with .root.Values.nats.tls.caSecret }}
- name: nats-ca
  secret:
    secretName: {{ . }}
{{- end }}
{{- with .identity.secret }}
- name: nats-identity
  secret:
    secretName: {{ . }}
{{- end }}
{{- end }}

{{/* What a platform team adds to one component's pods, from that component's values:
(dict "root" $ "values" .Values.<component> "component" "<component>").
"herald.podLabels" gives the pod template's labels: the component's `podLabels`, and the
chart's own, which win (the Deployment's or StatefulSet's selector must keep matching).
"herald.scheduling" gives the pod spec's priorityClassName, nodeSelector, tolerations,
affinity and topologySpreadConstraints; a constraint without `labelSelector` counts the
component's pods of this release. */}}
{{- define "herald.podLabels" -}}
{{- $own := include "herald.labels" .root | fromYaml }}
{{- $_ := set $own "app.kubernetes.io/component" .component }}
{{- toYaml (merge $own (deepCopy (.values.podLabels | default dict))) }}
{{- end }}

{{- define "herald.scheduling" -}}
{{- $values := .values }}
{{- with $values.priorityClassName }}
priorityClassName: {{ . | quote }}
{{- end }}
{{- with $values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $values.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $values.topologySpreadConstraints }}
{{- $selector := include (printf "herald.%s.selectorLabels" $.component) $.root | fromYaml }}
{{- $constraints := list }}
{{- range . }}
{{- $constraint := deepCopy . }}
{{- if not (hasKey $constraint "labelSelector") }}
{{- $_ := set $constraint "labelSelector" (dict "matchLabels" $selector) }}
{{- end }}
{{- $constraints = append $constraints $constraint }}
{{- end }}
topologySpreadConstraints:
  {{- toYaml $constraints | nindent 2 }}
{{- end }}
{{- end }}

{{/* A container's environment: the chart's own (`env`, a rendered YAML list), then the
component's `extraEnv`, which may not repeat a name the chart sets (two entries of one
name would leave which one counts to whoever applies the manifest):
(dict "env" (include ...) "extra" .Values.<component>.extraEnv "what" "<component>"). */}}
{{- define "herald.env" -}}
{{- $names := list }}
{{- range (.env | fromYamlArray) }}{{ $names = append $names .name }}{{ end }}
{{- range .extra }}
{{- if has .name $names }}
{{- fail (printf "%s.extraEnv: %s is set by the chart; use the chart's value for it (see values.yaml) or remove it from extraEnv" $.what .name) }}
{{- end }}
{{- end }}
{{- .env | trim }}
{{- with .extra }}
{{ toYaml . }}
{{- end }}
{{- end }}
