{{/* ---------------------------------------------------------------- names and labels */}}

{{- define "fedat.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "fedat.fullname" -}}
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

{{/* The name of one component's objects: <fullname>-<component>. Call with (list $ "barrier"). */}}
{{- define "fedat.componentName" -}}
{{- $root := index . 0 -}}
{{- printf "%s-%s" (include "fedat.fullname" $root) (index . 1) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "fedat.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "fedat.selectorLabels" -}}
app.kubernetes.io/name: {{ include "fedat.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "fedat.labels" -}}
helm.sh/chart: {{ include "fedat.chart" . }}
{{ include "fedat.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: fedat
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Labels of one component. Call with (list $ "barrier"). */}}
{{- define "fedat.componentLabels" -}}
{{ include "fedat.labels" (index . 0) }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end -}}

{{- define "fedat.componentSelectorLabels" -}}
{{ include "fedat.selectorLabels" (index . 0) }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end -}}

{{- define "fedat.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "fedat.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "fedat.hooksServiceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- include "fedat.componentName" (list . "hooks") -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* "repository:tag" of image.core or image.tf. Call with (list $ "core"). */}}
{{- define "fedat.image" -}}
{{- $root := index . 0 -}}
{{- $img := index $root.Values.image (index . 1) -}}
{{- printf "%s:%s" $img.repository (default $root.Chart.AppVersion $img.tag) -}}
{{- end -}}

{{/* ---------------------------------------------------------------- experiment settings */}}

{{/* One setting as the text of its FEDAT_* variable, as fedat.run.Experiment.env() writes it: lists comma-joined;
     whole numbers without a fraction or exponent (values arrive as float64, whose default format would print
     1000000 as 1e+06, which int() in the services cannot read). */}}
{{- define "fedat.envValue" -}}
{{- if kindIs "slice" . -}}
{{- $parts := list -}}
{{- range . -}}
{{- $parts = append $parts (include "fedat.envValue" .) -}}
{{- end -}}
{{- join "," $parts -}}
{{- else if kindIs "float64" . -}}
{{- if eq . (floor .) -}}{{ int64 . }}{{- else -}}{{ . }}{{- end -}}
{{- else -}}
{{- toString . -}}
{{- end -}}
{{- end -}}

{{- define "fedat.numTiers" -}}
{{- int64 (default 5 .Values.experiment.settings.num_tiers) -}}
{{- end -}}

{{/* ---------------------------------------------------------------- broker */}}

{{- define "fedat.rabbitmqName" -}}
{{- include "fedat.componentName" (list . "rabbitmq") -}}
{{- end -}}

{{- define "fedat.brokerHost" -}}
{{- if eq .Values.broker.mode "operator" -}}
{{- printf "%s.%s.svc" (include "fedat.rabbitmqName" .) .Release.Namespace -}}
{{- else -}}
{{- .Values.broker.host -}}
{{- end -}}
{{- end -}}

{{- define "fedat.amqpPort" -}}
{{- if .Values.broker.tls.enabled -}}
{{- if eq .Values.broker.mode "operator" }}5671{{ else }}{{ int64 .Values.broker.tls.port }}{{ end -}}
{{- else -}}
{{- if eq .Values.broker.mode "operator" }}5672{{ else }}{{ int64 .Values.broker.port }}{{ end -}}
{{- end -}}
{{- end -}}

{{- define "fedat.amqpScheme" -}}
{{- if .Values.broker.tls.enabled }}amqps{{ else }}amqp{{ end -}}
{{- end -}}

{{- define "fedat.managementUrl" -}}
{{- if eq .Values.broker.mode "operator" -}}
{{- if .Values.broker.tls.enabled -}}
{{- printf "https://%s:15671" (include "fedat.brokerHost" .) -}}
{{- else -}}
{{- printf "http://%s:15672" (include "fedat.brokerHost" .) -}}
{{- end -}}
{{- else -}}
{{- .Values.broker.managementUrl -}}
{{- end -}}
{{- end -}}

{{/* The management API's TCP port, from its URL (explicit port, else 443 for https, 80 for http). */}}
{{- define "fedat.managementPort" -}}
{{- $u := urlParse (include "fedat.managementUrl" .) -}}
{{- $hostport := $u.host -}}
{{- if regexMatch ":[0-9]+$" $hostport -}}
{{- regexFind "[0-9]+$" $hostport -}}
{{- else if eq $u.scheme "https" -}}443{{- else -}}80{{- end -}}
{{- end -}}

{{- define "fedat.adminSecret" -}}
{{- if and (eq .Values.broker.mode "operator") (not .Values.broker.admin.existingSecret) -}}
{{- printf "%s-default-user" (include "fedat.rabbitmqName" .) -}}
{{- else -}}
{{- .Values.broker.admin.existingSecret -}}
{{- end -}}
{{- end -}}

{{- define "fedat.tlsServerName" -}}
{{- default (include "fedat.brokerHost" .) .Values.broker.tls.serverName -}}
{{- end -}}

{{- define "fedat.credentialsSecret" -}}
{{- default (include "fedat.componentName" (list . "broker-credentials")) .Values.credentials.existingSecret -}}
{{- end -}}

{{- define "fedat.userPrefix" -}}
{{- if .Values.credentials.userPrefix -}}
{{- .Values.credentials.userPrefix -}}
{{- else -}}
{{- printf "%s-" .Values.broker.vhost -}}
{{- end -}}
{{- end -}}

{{/* Every service role that has a broker user (fedat.roles.SERVICE_ROLES), as JSON; the Secret holds them all. */}}
{{- define "fedat.allRoles" -}}
{{- list "worker" "barrier" "aggregator" "profiler" "evaluator" "seed" "recorder" | toJson -}}
{{- end -}}

{{/* The roles this release runs, as JSON: `fedat provision` creates users for these. `recorder` is KEDA's
     (read-only: it can look at queue depths, not take tasks). */}}
{{- define "fedat.brokerRoles" -}}
{{- $roles := list "worker" "barrier" "aggregator" "profiler" -}}
{{- if .Values.evaluator.enabled }}{{ $roles = append $roles "evaluator" }}{{ end -}}
{{- if .Values.seed.enabled }}{{ $roles = append $roles "seed" }}{{ end -}}
{{- if .Values.workers.keda.enabled }}{{ $roles = append $roles "recorder" }}{{ end -}}
{{- toJson $roles -}}
{{- end -}}

{{/* ---------------------------------------------------------------- hooks */}}

{{/* Annotations of a hook object. Call with (list "pre-install,pre-upgrade" "-20"). */}}
{{- define "fedat.hookAnnotations" -}}
helm.sh/hook: {{ index . 0 }}
helm.sh/hook-weight: {{ index . 1 | quote }}
helm.sh/hook-delete-policy: before-hook-creation
{{- end -}}

{{/* When the provisioning Job runs: before the services, unless the chart itself creates the broker (operator
     mode), which exists only after the release's own objects are applied. */}}
{{- define "fedat.provisionHook" -}}
{{- if eq .Values.broker.mode "operator" }}post-install,pre-upgrade{{ else }}pre-install,pre-upgrade{{ end -}}
{{- end -}}

{{/* ---------------------------------------------------------------- pods */}}

{{- define "fedat.podSecurity" -}}
securityContext:
  {{- toYaml .Values.podSecurityContext | nindent 2 }}
automountServiceAccountToken: false
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* The environment that says where the broker is and who this process is: its role's AMQP URL, no topology
   declarations (the provisioning Job did them; a role cannot configure), its keyring, TLS files.
   Call with (list $ "worker"). */}}
{{- define "fedat.brokerEnv" -}}
{{- $root := index . 0 -}}
{{- $role := index . 1 -}}
- name: FEDAT_AMQP_URL
  valueFrom:
    secretKeyRef:
      name: {{ include "fedat.credentialsSecret" $root }}
      key: {{ $role }}-amqp-url
- name: FEDAT_DECLARE_TOPOLOGY
  value: "0"
{{- if $root.Values.signing.insecureDisabled }}
- name: FEDAT_SIGNING
  value: "off"
{{- else }}
- name: FEDAT_KEYRING_FILE
  value: /etc/fedat/keys/{{ $role }}.json
{{- end }}
{{- if $root.Values.broker.tls.enabled }}
- name: FEDAT_TLS_CA_FILE
  value: /etc/fedat/tls/ca.crt
{{- if $root.Values.broker.tls.clientCert }}
- name: FEDAT_TLS_CERT_FILE
  value: /etc/fedat/tls/tls.crt
- name: FEDAT_TLS_KEY_FILE
  value: /etc/fedat/tls/tls.key
{{- end }}
- name: FEDAT_TLS_SERVER_NAME
  value: {{ include "fedat.tlsServerName" $root | quote }}
{{- end }}
- name: HOME
  value: /tmp
- name: PYTHONUNBUFFERED
  value: "1"
- name: PYTHONDONTWRITEBYTECODE
  value: "1"
{{- end -}}

{{/* Mounts for a broker client: /tmp, its own keyring, TLS files, data. Call with (list $ "worker" "tf"). */}}
{{- define "fedat.volumeMounts" -}}
{{- $root := index . 0 -}}
- name: tmp
  mountPath: /tmp
{{- if not $root.Values.signing.insecureDisabled }}
- name: keyring
  mountPath: /etc/fedat/keys
  readOnly: true
{{- end }}
{{- if $root.Values.broker.tls.enabled }}
- name: broker-tls
  mountPath: /etc/fedat/tls
  readOnly: true
{{- end }}
{{- if and (eq (index . 2) "tf") $root.Values.data.existingClaim }}
- name: data
  mountPath: {{ $root.Values.data.mountPath }}
  readOnly: true
{{- end }}
{{- end -}}

{{/* The volumes behind fedat.volumeMounts: the signing Secret with only `<role>.json` projected. */}}
{{- define "fedat.volumes" -}}
{{- $root := index . 0 -}}
{{- $role := index . 1 -}}
- name: tmp
  emptyDir:
    sizeLimit: {{ if eq (index . 2) "tf" }}1Gi{{ else }}256Mi{{ end }}
{{- if not $root.Values.signing.insecureDisabled }}
- name: keyring
  secret:
    secretName: {{ $root.Values.signing.existingSecret }}
    defaultMode: 0440
    items:
      - key: {{ $role }}.json
        path: {{ $role }}.json
{{- end }}
{{- if $root.Values.broker.tls.enabled }}
- name: broker-tls
  secret:
    secretName: {{ $root.Values.broker.tls.existingSecret }}
    defaultMode: 0440
    items:
      - key: {{ $root.Values.broker.tls.caKey }}
        path: ca.crt
      {{- if $root.Values.broker.tls.clientCert }}
      - key: {{ $root.Values.broker.tls.certKey }}
        path: tls.crt
      - key: {{ $root.Values.broker.tls.keyKey }}
        path: tls.key
      {{- end }}
{{- end }}
{{- if and (eq (index . 2) "tf") $root.Values.data.existingClaim }}
- name: data
  persistentVolumeClaim:
    claimName: {{ $root.Values.data.existingClaim }}
    readOnly: true
{{- end }}
{{- end -}}

{{/* ---------------------------------------------------------------- checks */}}

{{/* Refuses values that would render a broken or unsafe release, naming the value to change. values.schema.json
     checks types and ranges; these are the cross-field rules (and they still hold with --skip-schema-validation). */}}
{{- define "fedat.validate" -}}
{{- $v := .Values -}}
{{- if and (not $v.signing.insecureDisabled) (not $v.signing.existingSecret) -}}
{{- fail "signing.existingSecret is required: create a Secret with <role>.json for every role (`fedat keys --secret-file S --out-dir D`, then `kubectl create secret generic fedat-signing-keys --from-file=D`) and name it here; or set signing.insecureDisabled=true for a development broker where nobody signs" -}}
{{- end -}}
{{- if not (has $v.broker.mode (list "external" "operator")) -}}
{{- fail (printf "broker.mode must be external or operator, not %q" (toString $v.broker.mode)) -}}
{{- end -}}
{{- if and (eq $v.broker.mode "external") (not $v.broker.admin.existingSecret) -}}
{{- fail "broker.admin.existingSecret is required with broker.mode=external: a Secret with the provisioning user's name and password (keys broker.admin.usernameKey, broker.admin.passwordKey)" -}}
{{- end -}}
{{- if and (eq $v.broker.mode "external") (not $v.broker.host) -}}
{{- fail "broker.host is required with broker.mode=external" -}}
{{- end -}}
{{- if and $v.broker.tls.enabled (not $v.broker.tls.existingSecret) -}}
{{- fail "broker.tls.existingSecret is required with broker.tls.enabled=true: a Secret holding the CA (broker.tls.caKey) and, for mutual TLS, the client certificate and key" -}}
{{- end -}}
{{- if and (eq $v.broker.mode "external") $v.broker.tls.enabled (hasPrefix "http://" $v.broker.managementUrl) -}}
{{- fail "broker.managementUrl is plain http:// while broker.tls.enabled=true: the admin password would cross the network in clear; use the https:// management listener" -}}
{{- end -}}
{{- if and $v.workers.keda.enabled (hasKey $v.workers "replicas") (not (kindIs "invalid" $v.workers.replicas)) -}}
{{- fail "workers.replicas and workers.keda.enabled are mutually exclusive: with KEDA on, set workers.replicas: null (KEDA owns the count, between workers.keda.minReplicaCount and workers.keda.maxReplicaCount)" -}}
{{- end -}}
{{- if and (not $v.workers.keda.enabled) (or (not (hasKey $v.workers "replicas")) (kindIs "invalid" $v.workers.replicas)) -}}
{{- fail "workers.replicas is required unless workers.keda.enabled=true" -}}
{{- end -}}
{{- if and $v.workers.keda.enabled (gt (int64 $v.workers.keda.minReplicaCount) (int64 $v.workers.keda.maxReplicaCount)) -}}
{{- fail "workers.keda.minReplicaCount must not exceed workers.keda.maxReplicaCount" -}}
{{- end -}}
{{- if $v.workers.pdb.enabled -}}
{{- $floor := ternary $v.workers.keda.minReplicaCount $v.workers.replicas $v.workers.keda.enabled | int64 -}}
{{- if ge (int64 $v.workers.pdb.minAvailable) $floor -}}
{{- fail (printf "workers.pdb.minAvailable (%d) must be below the lowest worker count (%d: %s), or the PodDisruptionBudget blocks every node drain; lower it or set workers.pdb.enabled=false" (int64 $v.workers.pdb.minAvailable) $floor (ternary "workers.keda.minReplicaCount" "workers.replicas" $v.workers.keda.enabled)) -}}
{{- end -}}
{{- end -}}
{{- $s := $v.experiment.settings -}}
{{- if and (hasKey $s "min_clients") (hasKey $s "clients_per_round") (gt (int64 $s.min_clients) (int64 $s.clients_per_round)) -}}
{{- fail "experiment.settings.min_clients must not exceed experiment.settings.clients_per_round (the barrier refuses to start)" -}}
{{- end -}}
{{- if and (hasKey $s "tier_sizes") (kindIs "slice" $s.tier_sizes) (ne (len $s.tier_sizes) (int (include "fedat.numTiers" .))) -}}
{{- fail (printf "experiment.settings.tier_sizes has %d entries but num_tiers is %s: the profiler needs one per tier" (len $s.tier_sizes) (include "fedat.numTiers" .)) -}}
{{- end -}}
{{- if and (hasKey $s "group_sizes") (kindIs "slice" $s.group_sizes) -}}
{{- $sum := 0 -}}
{{- range $s.group_sizes }}{{ $sum = add $sum (int64 .) }}{{ end -}}
{{- if ne (int64 $sum) (int64 (default 100 $s.num_clients)) -}}
{{- fail (printf "experiment.settings.group_sizes sum to %d, not num_clients (%d): the workers refuse to start" (int64 $sum) (int64 (default 100 $s.num_clients))) -}}
{{- end -}}
{{- end -}}
{{- /* On a real install (lookup answers), check that the Secrets we mount hold what the pods need. */ -}}
{{- if not $v.signing.insecureDisabled -}}
{{- $keys := lookup "v1" "Secret" .Release.Namespace $v.signing.existingSecret -}}
{{- if $keys -}}
{{- range $role := (include "fedat.brokerRoles" . | fromJsonArray) -}}
{{- if and (ne $role "recorder") (not (hasKey (default dict $keys.data) (printf "%s.json" $role))) -}}
{{- fail (printf "Secret %s (signing.existingSecret) has no %s.json: write every role's keyring with `fedat keys` and create the Secret from that folder" $v.signing.existingSecret $role) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if $v.credentials.existingSecret -}}
{{- $creds := lookup "v1" "Secret" .Release.Namespace $v.credentials.existingSecret -}}
{{- if $creds -}}
{{- range $role := (include "fedat.brokerRoles" . | fromJsonArray) -}}
{{- range $suffix := list "password" "amqp-url" -}}
{{- if not (hasKey (default dict $creds.data) (printf "%s-%s" $role $suffix)) -}}
{{- fail (printf "Secret %s (credentials.existingSecret) has no key %s-%s" $v.credentials.existingSecret $role $suffix) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
