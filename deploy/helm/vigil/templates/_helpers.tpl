{{/* The release's name is every object's name (one release per namespace, like the overlays). */}}
{{- define "vigil.fullname" -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The labels every object carries; the selector is app.kubernetes.io/name alone (as the overlays'). */}}
{{- define "vigil.labels" -}}
app.kubernetes.io/name: vigil
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* A TOML value: a string (JSON escapes are TOML's), a bool, a whole number, a list. */}}
{{- define "vigil.tomlValue" -}}
{{- if kindIs "string" . -}}{{ toJson . }}
{{- else if kindIs "bool" . -}}{{ . }}
{{- else if kindIs "float64" . -}}{{ if eq . (floor .) }}{{ int64 . }}{{ else }}{{ . }}{{ end }}
{{- else if kindIs "slice" . -}}[{{ range $i, $e := . }}{{ if $i }}, {{ end }}{{ include "vigil.tomlValue" $e }}{{ end }}]
{{- else -}}{{ . }}
{{- end -}}
{{- end -}}

{{/* A TOML table: its keys, then its sub-tables ([prefix.key]); a null value is dropped. */}}
{{- define "vigil.tomlTable" -}}
{{- $t := .table -}}
{{- $prefix := .prefix -}}
{{- range $k := keys $t | sortAlpha }}
{{- $v := index $t $k }}
{{- if and (not (kindIs "map" $v)) (not (kindIs "invalid" $v)) }}
{{ $k }} = {{ include "vigil.tomlValue" $v }}
{{- end }}
{{- end }}
{{- range $k := keys $t | sortAlpha }}
{{- $v := index $t $k }}
{{- if kindIs "map" $v }}
{{- $name := ternary $k (printf "%s.%s" $prefix $k) (eq $prefix "") }}
[{{ $name }}]
{{- include "vigil.tomlTable" (dict "prefix" $name "table" $v) }}
{{- end }}
{{- end }}
{{- end -}}

{{/* vigil.toml: what the values choose, with .Values.config merged over it. */}}
{{- define "vigil.config" -}}
{{- $v := .Values -}}
{{- $rt := dict "kind" $v.runtime.kind "worker_label" $v.runtime.workerLabel -}}
{{- $c := dict "dry_run" $v.observe "runtime" $rt -}}
{{- if eq $v.runtime.kind "cri" }}
{{- $_ := set $rt "cri_socket" $v.runtime.cri.socket }}
{{- if $v.runtime.cri.podResourcesDir }}
{{- $_ := set $rt "pod_resources_socket" (printf "%s/kubelet.sock" $v.runtime.cri.podResourcesDir) }}
{{- else }}
{{- $_ := set $rt "pod_resources_socket" "" }}
{{- end }}
{{- else if eq $v.runtime.kind "docker" }}
{{- $_ := set $c "docker" (dict "host" "unix:///host/var/run/docker.sock") }}
{{- end }}
{{- if eq $v.accelerator "nvidia" }}
{{- $_ := set $c "gpu" (dict "library_path" $v.nvidia.libraryPath) }}
{{- else if eq $v.accelerator "tpu" }}
{{- $_ := set $c "gpu" (dict "enabled" "off") }}
{{- $_ := set $c "tpu" (dict "enabled" "on" "device_dir" "/host/dev" "sys_dir" "/sys" "kernel_log" "") }}
{{- end }}
{{- if $v.draDeviceTaints }}
{{- $gpu := (get $c "gpu") | default dict }}
{{- $_ := set $gpu "device_taints" true }}
{{- $_ := set $c "gpu" $gpu }}
{{- end }}
{{- $_ := set $c "server" (dict "listen" (printf "0.0.0.0:%v" $v.ports.metrics)) }}
{{- $_ := set $c "worker_api" (dict "listen" (printf "0.0.0.0:%v" $v.ports.workerApi) "auth" "kubernetes") }}
{{- $merged := mergeOverwrite $c (deepCopy ($v.config | default dict)) }}
{{- include "vigil.tomlTable" (dict "prefix" "" "table" $merged) }}
{{- end -}}

{{/* checkpoint.grace as vigil.toml carries it (the agent's default, 30s, where config sets none), in
whole seconds rounded up: the DaemonSet's grace period is it plus a margin. Helm parses no
duration, so the forms it takes are hours, minutes, seconds and milliseconds ("90s", "1m 30s"). */}}
{{- define "vigil.graceSeconds" -}}
{{- $grace := dig "checkpoint" "grace" "30s" ($.Values.config | default dict) | default "30s" | toString -}}
{{- if not (regexMatch `^\s*([0-9]+\s*(h|hr|hours?|m|min|minutes?|s|sec|seconds?|ms|msec)\s*)+$` $grace) }}
{{- fail (printf "config.checkpoint.grace %q: the chart sizes the pod's grace period from it and reads hours, minutes, seconds and milliseconds only (90s, 1m 30s, 2m)" $grace) }}
{{- end }}
{{- $ms := 0 }}
{{- range regexFindAll `[0-9]+\s*[a-z]+` $grace -1 }}
{{- $n := regexFind `^[0-9]+` . | atoi }}
{{- $unit := regexFind `[a-z]+$` . }}
{{- $per := 1000 }}
{{- if hasPrefix "h" $unit }}{{ $per = 3600000 }}
{{- else if or (eq $unit "ms") (eq $unit "msec") }}{{ $per = 1 }}
{{- else if hasPrefix "m" $unit }}{{ $per = 60000 }}
{{- end }}
{{- $ms = add $ms (mul $n $per) }}
{{- end -}}
{{- div (add $ms 999) 1000 -}}
{{- end -}}
