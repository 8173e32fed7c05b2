{{/* Chart name, truncated to a DNS label. */}}
{{- define "burst-prefix.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The name of every object of the release: the release name when it already contains the chart
name, else <release>-<chart>.
*/}}
{{- define "burst-prefix.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "burst-prefix.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels of every object of the release. */}}
{{- define "burst-prefix.labels" -}}
helm.sh/chart: {{ include "burst-prefix.chart" . }}
{{ include "burst-prefix.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: burst-prefix
{{- end }}

{{/* The operator pods (Deployment selector, Services, PodDisruptionBudget). */}}
{{- define "burst-prefix.selectorLabels" -}}
app.kubernetes.io/name: {{ include "burst-prefix.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{/*
An image reference from repository and tag, with the registry host replaced by
.Values.imageRegistry when that is set. Call with (dict "repository" R "tag" T "root" $).
*/}}
{{- define "burst-prefix.imageRef" -}}
{{- $repository := .repository }}
{{- $registry := .root.Values.imageRegistry }}
{{- if $registry }}
{{- $parts := splitList "/" $repository }}
{{- $first := first $parts }}
{{- if and (gt (len $parts) 1) (or (contains "." $first) (contains ":" $first) (eq $first "localhost")) }}
{{- $repository = join "/" (rest $parts) }}
{{- end }}
{{- $repository = printf "%s/%s" (trimSuffix "/" $registry) $repository }}
{{- end }}
{{- printf "%s:%s" $repository (default .root.Chart.AppVersion .tag) }}
{{- end }}

{{/* The operator image. */}}
{{- define "burst-prefix.image" -}}
{{- include "burst-prefix.imageRef" (dict "repository" .Values.image.repository "tag" .Values.image.tag "root" .) }}
{{- end }}

{{/* The producer image the operator deploys (--producer-image). */}}
{{- define "burst-prefix.producerImage" -}}
{{- include "burst-prefix.imageRef" (dict "repository" .Values.producer.image.repository "tag" .Values.producer.image.tag "root" .) }}
{{- end }}

{{/* "true" when the operator takes the leader Lease: asked for, or more than one replica. */}}
{{- define "burst-prefix.leaderElection" -}}
{{- if or .Values.leaderElection.enabled (gt (int .Values.replicas) 1) }}true{{ end }}
{{- end }}

{{/* The Lease the replicas elect a leader with (in the release namespace). */}}
{{- define "burst-prefix.leaseName" -}}
{{- include "burst-prefix.fullname" . }}
{{- end }}

{{/*
What the operator reads where it watches (crates/operator: controller.rs, apply.rs), and nothing
else. Cluster-wide this is the ClusterRole <fullname>-read; per namespace it is half of the Role.
*/}}
{{- define "burst-prefix.operatorReadRules" -}}
# BurstPrefixPolicies: watched (list, watch); get reads the status of one whose spec this
# operator cannot deserialize.
- apiGroups: ["burstprefix.io"]
  resources: ["burstprefixpolicies"]
  verbs: ["get", "list", "watch"]
# The inference pods: listed in every reconcile, and watched (metadata, Running pods only).
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list", "watch"]
# InferencePools (poolRef): read in reconcile, watched once the API is served.
- apiGroups: ["inference.networking.k8s.io"]
  resources: ["inferencepools"]
  verbs: ["get", "list", "watch"]
# The children, watched by the operator's label (list, watch). configmaps also need get: the
# producer Role grants get, list, watch on its ConfigMap, and RBAC lets the operator grant only
# what it holds itself. deployments: get, read back when an apply failed.
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["get", "list", "watch"]
- apiGroups: [""]
  resources: ["services", "serviceaccounts"]
  verbs: ["list", "watch"]
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["get", "list", "watch"]
- apiGroups: ["rbac.authorization.k8s.io"]
  resources: ["roles", "rolebindings"]
  verbs: ["list", "watch"]
- apiGroups: ["policy"]
  resources: ["poddisruptionbudgets"]
  verbs: ["get", "list", "watch"]
# networkpolicies: watched whether or not producer.networkPolicy is enabled (a policy's
# NetworkPolicy is deleted when it is turned off: get finds it).
- apiGroups: ["networking.k8s.io"]
  resources: ["networkpolicies"]
  verbs: ["get", "list", "watch"]
{{- end }}

{{/*
What the operator writes where it watches: the cluster-wide write path when it watches all
namespaces (ClusterRole <fullname>-write), the other half of the Role per namespace.
*/}}
{{- define "burst-prefix.operatorWriteRules" -}}
# The status, written by server-side apply.
- apiGroups: ["burstprefix.io"]
  resources: ["burstprefixpolicies/status"]
  verbs: ["patch"]
# The children of a policy, written by server-side apply (patch, plus create when the object is
# new). They carry owner references, so the garbage collector deletes them with their policy;
# the operator deletes only a PodDisruptionBudget and Lease it made when the policy goes back to
# one producer replica.
- apiGroups: [""]
  resources: ["configmaps", "services", "serviceaccounts"]
  verbs: ["create", "patch"]
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["create", "patch"]
- apiGroups: ["rbac.authorization.k8s.io"]
  resources: ["roles", "rolebindings"]
  verbs: ["create", "patch"]
- apiGroups: ["policy"]
  resources: ["poddisruptionbudgets"]
  verbs: ["create", "patch", "delete"]
# The producers' NetworkPolicies (producer.networkPolicy); deleted when it is turned off.
- apiGroups: ["networking.k8s.io"]
  resources: ["networkpolicies"]
  verbs: ["create", "patch", "delete"]
# The producers' Leases (replicas > 1): the operator creates each, and holds get and patch
# because the producer Role grants them (RBAC lets it grant only what it holds).
- apiGroups: ["coordination.k8s.io"]
  resources: ["leases"]
  verbs: ["get", "create", "patch", "delete"]
# Events on policies (kube-runtime's Recorder: create, then patch a repeated one).
- apiGroups: ["events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch"]
{{- end }}

{{/* The operator's flags from the values (besides the admin port and leader election). */}}
{{- define "burst-prefix.operatorArgs" -}}
{{- with .Values.watchNamespaces }}
- --watch-namespace={{ join "," . }}
{{- end }}
{{- with .Values.podSelector }}
- {{ printf "--pod-selector=%s" . | quote }}
{{- end }}
- {{ printf "--producer-image=%s" (include "burst-prefix.producerImage" .) | quote }}
{{- with .Values.producer.image.pullPolicy }}
- --producer-image-pull-policy={{ . }}
{{- end }}
{{- range .Values.producer.imagePullSecrets }}
- --producer-image-pull-secret={{ .name }}
{{- end }}
{{- with .Values.producer.resources }}
- {{ printf "--producer-resources=%s" (toJson .) | quote }}
{{- end }}
{{- range .Values.producer.allowedImagePrefixes }}
- {{ printf "--allowed-producer-image-prefix=%s" . | quote }}
{{- end }}
{{- with .Values.producer.networkPolicy }}
{{- if .enabled }}
{{- $peers := dict "api" (.api | default list) "endpointPicker" (.endpointPicker | default list) "admin" (.admin | default list) }}
- {{ printf "--producer-network-policy=%s" (toJson $peers) | quote }}
{{- end }}
{{- end }}
- --pool-api-recheck-seconds={{ .Values.poolApiRecheckSeconds }}
- --api-refusal-grace-seconds={{ .Values.apiRefusalGraceSeconds }}
{{- end }}
