{{/* The one namespace hcp-olm runs in (the admission policies name its ServiceAccount there). */}}
{{- define "hcp-olm.namespace" -}}
{{- if ne .Release.Namespace "hcp-olm-system" -}}
{{- fail (printf "hcp-olm installs into the namespace hcp-olm-system only (its admission policies name the controller's ServiceAccount there); got %q: use -n hcp-olm-system" .Release.Namespace) -}}
{{- end -}}
hcp-olm-system
{{- end -}}

{{- define "hcp-olm.labels" -}}
app.kubernetes.io/name: hcp-olm-controller
app.kubernetes.io/part-of: hcp-olm
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | quote }}
{{- end -}}

{{/* An image of ours: (dict "root" $ "c" .Values.image.<component>). A digest wins over the tag. */}}
{{- define "hcp-olm.image" -}}
{{- $registry := .root.Values.image.registry | trimSuffix "/" -}}
{{- $repo := .c.repository -}}
{{- if $registry -}}{{- $repo = printf "%s/%s" $registry .c.repository -}}{{- end -}}
{{- if .c.digest -}}
{{- if not (regexMatch "^sha256:[0-9a-f]{64}$" .c.digest) -}}
{{- fail (printf "image digest %q of %s is not sha256:<64 hex digits>" .c.digest .c.repository) -}}
{{- end -}}
{{- printf "%s@%s" $repo .c.digest -}}
{{- else -}}
{{- printf "%s:%s" $repo (default (printf "v%s" .root.Chart.AppVersion) .c.tag) -}}
{{- end -}}
{{- end -}}

{{/* One flag as arguments: (list name value). A list repeats the flag; "" and null leave the default. */}}
{{- define "hcp-olm.flag" -}}
{{- $name := index . 0 -}}
{{- $value := index . 1 -}}
{{- if not (regexMatch "^[a-z][a-z0-9-]*$" $name) -}}
{{- fail (printf "flags: %q is not a flag name (lower case, digits and dashes, without the leading --)" $name) -}}
{{- end -}}
{{- if kindIs "slice" $value -}}
{{- range $value }}
- {{ printf "--%s=%v" $name . | quote }}
{{- end -}}
{{- else if kindIs "map" $value -}}
{{- fail (printf "flags.%s: a map is not a flag value" $name) -}}
{{- else if not (or (kindIs "invalid" $value) (and (kindIs "string" $value) (eq $value ""))) -}}
{{- if kindIs "float64" $value }}
- {{ printf "--%s=%s" $name (toString ($value | int64)) | quote }}
{{- else }}
- {{ printf "--%s=%v" $name $value | quote }}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The controller's arguments: the chart's own settings, then .Values.flags (which may override them). */}}
{{- define "hcp-olm.args" -}}
{{- if not (has .Values.catalogSharing (list "Shared" "Own")) -}}
{{- fail (printf "catalogSharing: %q is not Shared or Own" (toString .Values.catalogSharing)) -}}
{{- end -}}
{{- if not (has .Values.hyperShiftOLM (list "StandDown" "TakeOver")) -}}
{{- fail (printf "hyperShiftOLM: %q is not StandDown or TakeOver" (toString .Values.hyperShiftOLM)) -}}
{{- end -}}
{{- $f := dict
  "leader-elect" true
  "secure-metrics-addr" (printf "0.0.0.0:%d" (int .Values.metrics.port))
  "log-format" .Values.logFormat
  "catalog-sharing" .Values.catalogSharing
  "hypershift-olm" .Values.hyperShiftOLM
  "hosted-cluster-selector" .Values.hostedClusterSelector
  "catalog-server-image" (include "hcp-olm.image" (dict "root" . "c" .Values.image.catalogServer))
  "tunnel-gateway-image" (include "hcp-olm.image" (dict "root" . "c" .Values.image.tunnelGateway))
  "guest-agent-image" (include "hcp-olm.image" (dict "root" . "c" .Values.image.guestAgent))
-}}
{{- if .Values.metrics.certSecret -}}
{{- $_ := set $f "metrics-cert-dir" "/etc/hcp-olm/metrics-tls" -}}
{{- end -}}
{{- if .Values.pullSecret.name -}}
{{- $_ := set $f "pull-secret-file" "/etc/hcp-olm/pull-secret/.dockerconfigjson" -}}
{{- end -}}
{{- range $k, $v := .Values.flags -}}
{{- $_ := set $f $k $v -}}
{{- end -}}
- run
{{- range $k := keys $f | sortAlpha }}
{{- include "hcp-olm.flag" (list $k (index $f $k)) }}
{{- end }}
{{- end -}}
