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

{{/* The Kubernetes version features are chosen for: kubeVersion when set (offline renders, GitOps tools that do not
     pass the cluster's), else the cluster's. */}}
{{- define "fedat.kubeVersion" -}}
{{- default .Capabilities.KubeVersion.Version .Values.kubeVersion -}}
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

{{/* "repository:tag" of image.core or image.tf, or "repository@digest" when a digest pins it (`make release` writes
     the digests into a values file). Call with (list $ "core"). */}}
{{- define "fedat.image" -}}
{{- $root := index . 0 -}}
{{- $img := index $root.Values.image (index . 1) -}}
{{- if $img.digest -}}
{{- printf "%s@%s" $img.repository $img.digest -}}
{{- else -}}
{{- printf "%s:%s" $img.repository (default $root.Chart.AppVersion $img.tag) -}}
{{- end -}}
{{- end -}}

{{/* ---------------------------------------------------------------- experiment settings */}}

{{/* One setting as the text of its FEDAT_* variable, as fedat.lab.run.Experiment.env() writes it: lists comma-joined;
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

{{/* Where the clients are (fedat.protocol.system.Mode): "pool", worker processes in the cluster train the experiment's
     logical clients (the default); or "real", every client is a `fedat-client` process at its own site, connecting
     to the broker from outside. experiment.settings.clients (FEDAT_CLIENTS) says which; the services read the same
     variable from the ConfigMap. */}}
{{- define "fedat.clients" -}}
{{- default "pool" .Values.experiment.settings.clients -}}
{{- end -}}

{{/* The long-running services of this release, in order, as JSON (the system table's processes of that mode that
     are not Jobs): a pool runs workers and, with evaluator.enabled, the central evaluator; real clients are scored
     by the collector (federated evaluation), the server has no data. */}}
{{- define "fedat.services" -}}
{{- $names := list "barrier" "aggregator" "profiler" -}}
{{- if eq (include "fedat.clients" .) "real" -}}
{{- $names = append $names "collector" -}}
{{- else -}}
{{- $names = append $names "worker" -}}
{{- if .Values.evaluator.enabled }}{{ $names = append $names "evaluator" }}{{ end -}}
{{- end -}}
{{- toJson $names -}}
{{- end -}}

{{/* The values block of a service: `workers` for the worker, else the service's own. Call with (list $ "worker"). */}}
{{- define "fedat.serviceValues" -}}
{{- $root := index . 0 -}}
{{- $name := index . 1 -}}
{{- toJson (index $root.Values (ternary "workers" $name (eq $name "worker"))) -}}
{{- end -}}

{{/* The run a checkpoint belongs to (FEDAT_RUN_ID, part of every checkpoint's fingerprint): experiment.runId, else
     <namespace>/<release>/<experiment.name>. Two releases sharing a vhost by mistake then refuse each other's. */}}
{{- define "fedat.runId" -}}
{{- default (printf "%s/%s/%s" .Release.Namespace .Release.Name .Values.experiment.name) .Values.experiment.runId -}}
{{- end -}}

{{/* The experiment's settings as env entries, exactly as the ConfigMap holds them, plus FEDAT_RUN_ID: for the hook
     that must see the NEW values before the ConfigMap is updated. */}}
{{- define "fedat.settingsEnv" -}}
{{- range $key, $value := .Values.experiment.settings }}
- name: {{ printf "FEDAT_%s" (upper $key) }}
  value: {{ include "fedat.envValue" $value | quote }}
{{- end }}
- name: FEDAT_RUN_ID
  value: {{ include "fedat.runId" . | quote }}
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

{{/* Every service role that has a broker user (fedat.deploy.roles.SERVICE_ROLES), as JSON; the Secret holds them all. */}}
{{- define "fedat.allRoles" -}}
{{- list "worker" "barrier" "aggregator" "profiler" "evaluator" "collector" "seed" "recorder" | toJson -}}
{{- end -}}

{{/* The roles this release runs, as JSON, in the system table's order: `fedat provision` creates users for these.
     `recorder` is read-only (it can look at queues and read the recorder's copies of the global models, not take
     a task): KEDA counts the train queues as it, and `helm test` checks the release as it. */}}
{{- define "fedat.brokerRoles" -}}
{{- $services := include "fedat.services" . | fromJsonArray -}}
{{- $roles := list -}}
{{- range $role := list "worker" "barrier" "aggregator" "profiler" "evaluator" "collector" -}}
{{- if has $role $services }}{{ $roles = append $roles $role }}{{ end -}}
{{- end -}}
{{- if .Values.seed.enabled }}{{ $roles = append $roles "seed" }}{{ end -}}
{{- $roles = append $roles "recorder" -}}
{{- toJson $roles -}}
{{- end -}}

{{/* "true" when `lookup` reads this cluster (a real install or upgrade), "" when it answers nothing (`helm template`,
     --dry-run=client, GitOps renderers). Every namespace has the ServiceAccount "default". */}}
{{- define "fedat.canLookup" -}}
{{- if lookup "v1" "ServiceAccount" .Release.Namespace "default" }}true{{ end -}}
{{- end -}}

{{/* sha256 over the data of the Secrets the pods read (credentials, signing keys, TLS), so that a rotated Secret rolls
     them. Generated credentials are hashed as rendered; existing Secrets as `lookup` reads them (nothing offline). */}}
{{- define "fedat.secretsChecksum" -}}
{{- $parts := list (include (print .Template.BasePath "/credentials-secret.yaml") . | sha256sum) -}}
{{- $names := list -}}
{{- if .Values.credentials.existingSecret }}{{ $names = append $names .Values.credentials.existingSecret }}{{ end -}}
{{- if not .Values.signing.insecureDisabled }}{{ $names = append $names .Values.signing.existingSecret }}{{ end -}}
{{- if .Values.broker.tls.enabled }}{{ $names = append $names .Values.broker.tls.existingSecret }}{{ end -}}
{{- range $name := $names -}}
{{- $s := lookup "v1" "Secret" $.Release.Namespace $name -}}
{{- $parts = append $parts (printf "%s=%s" $name (toJson (default dict (get (default dict $s) "data")) | sha256sum)) -}}
{{- end -}}
{{- join "," $parts | sha256sum -}}
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

{{/* Whether a role reads its AMQP URL (password inside) from a mounted file: every long-running service does
     (fedat.runtime.serving reads FEDAT_AMQP_URL_FILE); the seed Job publishes once through a path that reads only
     FEDAT_AMQP_URL. */}}
{{- define "fedat.urlFromFile" -}}
{{- if ne . "seed" }}true{{ end -}}
{{- end -}}

{{/* The environment that says where the broker is and who this process is: its role's AMQP URL (as a mounted file
   where the process reads one), no topology declarations (the provisioning Job did them; a role cannot configure),
   its keyring, TLS files. Call with (list $ "worker"). */}}
{{- define "fedat.brokerEnv" -}}
{{- $root := index . 0 -}}
{{- $role := index . 1 -}}
- name: FEDAT_RUN_ID
  value: {{ include "fedat.runId" $root | quote }}
{{- if include "fedat.urlFromFile" $role }}
- name: FEDAT_AMQP_URL_FILE
  value: /etc/fedat/broker/amqp-url
{{- else }}
- name: FEDAT_AMQP_URL
  valueFrom:
    secretKeyRef:
      name: {{ include "fedat.credentialsSecret" $root }}
      key: {{ $role }}-amqp-url
{{- end }}
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

{{/* The app's folder on the Python path of the pods that import the app (image.tf: seed, worker, evaluator), when
     app.volume mounts it; "" otherwise (the app is in the image: the built-in one, or one installed FROM fedat-tf). */}}
{{- define "fedat.appEnv" -}}
{{- if .Values.app.volume -}}
- name: PYTHONPATH
  value: {{ .Values.app.mountPath | quote }}
{{- end -}}
{{- end -}}

{{/* Mounts for a broker client: /tmp, its own keyring, TLS files, data, the app. Call with (list $ "worker" "tf"). */}}
{{- define "fedat.volumeMounts" -}}
{{- $root := index . 0 -}}
- name: tmp
  mountPath: /tmp
{{- if include "fedat.urlFromFile" (index . 1) }}
- name: broker-url
  mountPath: /etc/fedat/broker
  readOnly: true
{{- end }}
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
{{- if and (eq (index . 2) "tf") $root.Values.app.volume }}
- name: app
  mountPath: {{ $root.Values.app.mountPath }}
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
{{- if include "fedat.urlFromFile" $role }}
- name: broker-url
  secret:
    secretName: {{ include "fedat.credentialsSecret" $root }}
    defaultMode: 0440
    items:
      - key: {{ $role }}-amqp-url
        path: amqp-url
{{- end }}
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
{{- with and (eq (index . 2) "tf") $root.Values.app.volume }}
- name: app
  {{- toYaml . | nindent 2 }}
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
{{- if not (has (include "fedat.clients" .) (list "pool" "real")) -}}
{{- fail (printf "experiment.settings.clients must be pool (workers train logical clients) or real (fedat-client processes at the sites), not %q" (include "fedat.clients" .)) -}}
{{- end -}}
{{- if eq (include "fedat.clients" .) "real" -}}
{{- if $v.workers.keda.enabled -}}
{{- fail "workers.keda.enabled scales the simulated worker pool, and experiment.settings.clients=real runs none (the clients are processes at the sites): set workers.keda.enabled=false" -}}
{{- end -}}
{{- else -}}
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
{{- /* Where lookup reads the cluster, every Secret the release names must exist: a missing one would only show up
   as pods stuck in CreateContainerConfigError. Offline renders (helm template, GitOps) cannot tell and pass. */ -}}
{{- if include "fedat.canLookup" . -}}
{{- $named := dict -}}
{{- if not $v.signing.insecureDisabled }}{{ $_ := set $named "signing.existingSecret" $v.signing.existingSecret }}{{ end -}}
{{- if $v.credentials.existingSecret }}{{ $_ := set $named "credentials.existingSecret" $v.credentials.existingSecret }}{{ end -}}
{{- if $v.broker.admin.existingSecret }}{{ $_ := set $named "broker.admin.existingSecret" $v.broker.admin.existingSecret }}{{ end -}}
{{- if $v.broker.tls.enabled }}{{ $_ := set $named "broker.tls.existingSecret" $v.broker.tls.existingSecret }}{{ end -}}
{{- range $key := keys $named | sortAlpha -}}
{{- $name := get $named $key -}}
{{- if not (lookup "v1" "Secret" $.Release.Namespace $name) -}}
{{- fail (printf "%s names Secret %s, which does not exist in namespace %s: create it first (chart README, \"Install on a cluster\")" $key $name $.Release.Namespace) -}}
{{- end -}}
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
