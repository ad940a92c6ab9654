{{/*
Egress proxies of the dispatcher (values dispatcher.egressProxy). The default proxy is
named `default`; endpoints pick the others by name. Credentials come from Secrets,
projected into one read-only directory, a file per proxy named after it holding
`user:password`; they never go into an environment variable or a URL.
*/}}

{{/* The proxies with credentials, as a list of (dict "name" "secret" "key"). */}}
{{- define "herald.egressCredentials" -}}
{{- $p := .Values.dispatcher.egressProxy }}
{{- $out := list }}
{{- if and $p.url $p.credentialsSecret.name }}
{{- $out = append $out (dict "name" "default" "secret" $p.credentialsSecret.name "key" ($p.credentialsSecret.key | default "credentials")) }}
{{- end }}
{{- range $p.named }}
{{- $name := .name }}
{{- if eq .name "default" }}
{{- fail "dispatcher.egressProxy.named: the name \"default\" is the dispatcher-wide proxy (dispatcher.egressProxy.url); choose another" }}
{{- end }}
{{- with .credentialsSecret }}{{ if .name }}
{{- $out = append $out (dict "name" $name "secret" .name "key" (.key | default "credentials")) }}
{{- end }}{{ end }}
{{- end }}
{{- toJson $out }}
{{- end }}

{{/* The egress flags: (dict "root" $ "credentials" true) for the dispatcher; the
operator gets the same proxies (it refuses an endpoint picking one the dispatchers would
refuse) without credentials. */}}
{{- define "herald.egressEnv" -}}
{{- $p := .root.Values.dispatcher.egressProxy }}
{{- with $p.url }}
- name: HERALD_EGRESS_PROXY
  value: {{ . | quote }}
{{- end }}
{{- with $p.named }}
- name: HERALD_EGRESS_PROXIES
  value: {{ $named := list }}{{ range . }}{{ $named = append $named (printf "%s=%s" .name .url) }}{{ end }}{{ join "," $named | quote }}
{{- end }}
{{- with $p.noProxy }}
- name: HERALD_EGRESS_NO_PROXY
  value: {{ join "," . | quote }}
{{- end }}
{{- if $p.allowDirect }}
- name: HERALD_EGRESS_ALLOW_DIRECT
  value: "true"
{{- end }}
{{- if and .credentials (fromJsonArray (include "herald.egressCredentials" .root)) }}
- name: HERALD_EGRESS_PROXY_CREDENTIALS
  value: /etc/herald/egress-proxy
{{- end }}
{{- end }}

{{- define "herald.egressVolumeMounts" -}}
{{- if fromJsonArray (include "herald.egressCredentials" .) }}
- name: egress-proxy-credentials
  mountPath: /etc/herald/egress-proxy
  readOnly: true
{{- end }}
{{- end }}

{{- define "herald.egressVolumes" -}}
{{- with fromJsonArray (include "herald.egressCredentials" .) }}
- name: egress-proxy-credentials
  projected:
    sources:
      {{- range . }}
      - secret:
          name: {{ .secret }}
          items:
            - key: {{ .key }}
              path: {{ .name }}
      {{- end }}
{{- end }}
{{- end }}
