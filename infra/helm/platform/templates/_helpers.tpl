{{/* Names, labels and the environment shared by the control-plane pods. */}}

{{- define "platform.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "platform.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* Selector labels of one component: include "platform.selector" (list . "api") */}}
{{- define "platform.selector" -}}
app.kubernetes.io/name: {{ (index . 0).Chart.Name }}
app.kubernetes.io/instance: {{ (index . 0).Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end -}}

{{- define "platform.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "platform.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "platform.image" -}}
{{- $img := index . 0 -}}{{- $root := index . 1 -}}
{{- printf "%s:%s" $img.repository (default $root.Chart.AppVersion $img.tag) -}}
{{- end -}}

{{- define "platform.secretName" -}}
{{- default (printf "%s-secrets" (include "platform.fullname" .)) .Values.secrets.existingSecret -}}
{{- end -}}

{{- define "platform.apiHost" -}}
{{- printf "%s-api.%s.svc" (include "platform.fullname" .) .Release.Namespace -}}
{{- end -}}

{{/* The Secret and key holding PLATFORM_DATABASE_URL. */}}
{{- define "platform.databaseSecret" -}}
{{- if .Values.postgresql.enabled -}}
name: {{ include "platform.fullname" . }}-postgresql
key: database-url
{{- else -}}
name: {{ required "postgresql.external.existingSecret is required with postgresql.enabled=false" .Values.postgresql.external.existingSecret }}
key: {{ .Values.postgresql.external.existingSecretKey }}
{{- end -}}
{{- end -}}

{{/* Environment of every control-plane container (API, reconciler, Celery, migration). */}}
{{- define "platform.env" -}}
- name: PLATFORM_DATABASE_URL
  valueFrom:
    secretKeyRef:
      {{- include "platform.databaseSecret" . | nindent 6 }}
{{- if and (not .Values.redis.enabled) .Values.redis.external.existingSecret }}
- name: PLATFORM_REDIS_URL
  valueFrom:
    secretKeyRef:
      name: {{ .Values.redis.external.existingSecret }}
      key: {{ .Values.redis.external.existingSecretKey }}
{{- end }}
- name: PLATFORM_WORKER_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ include "platform.secretName" . }}
      key: PLATFORM_WORKER_TOKEN
- name: PLATFORM_SECRET_KEY
  valueFrom:
    secretKeyRef:
      name: {{ include "platform.secretName" . }}
      key: PLATFORM_SECRET_KEY
- name: AWS_ACCESS_KEY_ID
  valueFrom:
    secretKeyRef:
      name: {{ required "s3.existingSecret is required" .Values.s3.existingSecret }}
      key: AWS_ACCESS_KEY_ID
- name: AWS_SECRET_ACCESS_KEY
  valueFrom:
    secretKeyRef:
      name: {{ .Values.s3.existingSecret }}
      key: AWS_SECRET_ACCESS_KEY
{{- end -}}

{{/* Volumes every control-plane pod mounts: its root filesystem is read-only. */}}
{{- define "platform.tmpVolume" -}}
- name: tmp
  emptyDir: {}
{{- end -}}
{{- define "platform.tmpMount" -}}
- name: tmp
  mountPath: /tmp
{{- end -}}

{{/* Namespace of worker pods, their Secrets and the reconciler's Lease. */}}
{{- define "platform.workerNamespace" -}}
{{- default .Release.Namespace .Values.workers.namespace -}}
{{- end -}}

{{/* The Secret (in the workers' namespace) whose key worker pods read PLATFORM_WORKER_TOKEN
from: given, the platform's own (same namespace), or a copy secret.yaml makes there. */}}
{{- define "platform.workerTokenSecret" -}}
{{- if .Values.workers.tokenSecret.name -}}
name: {{ .Values.workers.tokenSecret.name }}
key: {{ .Values.workers.tokenSecret.key }}
{{- else if eq (include "platform.workerNamespace" .) .Release.Namespace -}}
name: {{ include "platform.secretName" . }}
key: PLATFORM_WORKER_TOKEN
{{- else if not .Values.secrets.existingSecret -}}
name: {{ include "platform.fullname" . }}-worker-token
key: PLATFORM_WORKER_TOKEN
{{- else -}}
{{- fail "workers.tokenSecret.name is required: secrets.existingSecret cannot be read from another namespace" -}}
{{- end -}}
{{- end -}}

{{/* The Kubernetes provider's settings (control_plane/settings.py, "Kubernetes provider"):
where worker pods go and what they look like. */}}
{{- define "platform.kubernetesEnv" -}}
{{- $token := include "platform.workerTokenSecret" . | fromYaml -}}
{{- $selectors := dict -}}{{- $tolerations := dict -}}{{- $resources := dict -}}
{{- range $name, $acc := .Values.workers.accelerators }}
{{- $_ := set $selectors $name ($acc.nodeSelector | default dict) -}}
{{- $_ := set $tolerations $name ($acc.tolerations | default list) -}}
{{- $_ := set $resources $name ($acc.resources | default dict) -}}
{{- end -}}
- name: PLATFORM_KUBERNETES_NAMESPACE
  value: {{ include "platform.workerNamespace" . | quote }}
- name: PLATFORM_KUBERNETES_WORKER_IMAGE
  value: {{ include "platform.image" (list .Values.image.worker .) | quote }}
- name: PLATFORM_KUBERNETES_IMAGE_PULL_POLICY
  value: {{ .Values.image.worker.pullPolicy | quote }}
{{- with .Values.workers.serviceAccountName }}
- name: PLATFORM_KUBERNETES_SERVICE_ACCOUNT
  value: {{ . | quote }}
{{- end }}
- name: PLATFORM_KUBERNETES_WORKER_TOKEN_SECRET
  value: {{ $token.name | quote }}
- name: PLATFORM_KUBERNETES_WORKER_TOKEN_SECRET_KEY
  value: {{ $token.key | quote }}
- name: PLATFORM_KUBERNETES_NODE_SELECTORS
  value: {{ toJson $selectors | quote }}
- name: PLATFORM_KUBERNETES_TOLERATIONS
  value: {{ toJson $tolerations | quote }}
- name: PLATFORM_KUBERNETES_WORKER_RESOURCES
  value: {{ toJson $resources | quote }}
- name: PLATFORM_KUBERNETES_GPU_RESOURCE
  value: {{ .Values.workers.gpuResource | quote }}
- name: PLATFORM_KUBERNETES_DRAIN_GRACE_S
  value: {{ .Values.workers.drainGraceSeconds | quote }}
- name: PLATFORM_KUBERNETES_WORKER_METRICS_PORT
  value: {{ .Values.workers.metricsPort | quote }}
{{- with .Values.workers.diskCacheHostPath }}
- name: PLATFORM_KUBERNETES_DISK_CACHE_HOST_PATH
  value: {{ . | quote }}
{{- end }}
{{- with .Values.workers.diskCacheClaim }}
- name: PLATFORM_KUBERNETES_DISK_CACHE_CLAIM
  value: {{ . | quote }}
{{- end }}
{{- with .Values.workers.memoryCacheHostPath }}
- name: PLATFORM_KUBERNETES_MEMORY_CACHE_HOST_PATH
  value: {{ . | quote }}
{{- end }}
# Worker pods carry app.kubernetes.io/instance=<release>: NetworkPolicy lets them in.
- name: PLATFORM_KUBERNETES_INSTANCE
  value: {{ .Release.Name | quote }}
{{- end -}}

{{/* The reconciler's and Celery's own /metrics (control_plane/metrics/server.py): the
process serves its event families on this port; Prometheus scrapes it and the probes check it.
include "platform.metricsEnv" PORT, and "platform.metricsServing" PORT in the container. */}}
{{- define "platform.metricsEnv" -}}
- name: PLATFORM_METRICS_HOST
  value: "0.0.0.0"
- name: PLATFORM_METRICS_PORT
  value: {{ . | quote }}
{{- end -}}
{{- define "platform.metricsServing" -}}
ports:
  - name: metrics
    containerPort: {{ . }}
    protocol: TCP
{{- /* The port is served by a thread of the process itself, from its start: an answer
means the process runs and is not wedged (a scrape reads a few small files). Nothing here goes
through Redis or SQL, so a store's outage restarts nothing; a reconciler whose loop hangs stops
renewing the Lease and a standby takes over within leaseSeconds. */}}
startupProbe:
  httpGet:
    path: /metrics
    port: metrics
  periodSeconds: 2
  failureThreshold: 60
livenessProbe:
  httpGet:
    path: /metrics
    port: metrics
  periodSeconds: 20
  timeoutSeconds: 5
  failureThreshold: 3
readinessProbe:
  httpGet:
    path: /metrics
    port: metrics
  periodSeconds: 10
  timeoutSeconds: 5
  failureThreshold: 2
{{- end -}}

{{/* A NetworkPolicy peer of the worker pods when they run in another namespace (a plain
podSelector matches its own namespace only); nothing when they share the release's. */}}
{{- define "platform.workerPeer" -}}
{{- $ns := include "platform.workerNamespace" . -}}
{{- if ne $ns .Release.Namespace -}}
- namespaceSelector:
    matchLabels:
      kubernetes.io/metadata.name: {{ $ns }}
  podSelector:
    matchLabels:
      app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}
{{- end -}}
