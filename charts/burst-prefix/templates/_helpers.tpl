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

{{- define "burst-prefix.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
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
The one watched namespace, or "" for all namespaces. The schema already limits the list to one
item; this repeats the check for a chart rendered without schema validation (--skip-schema-validation).
*/}}
{{- define "burst-prefix.watchNamespace" -}}
{{- if gt (len .Values.watchNamespaces) 1 }}
{{- fail (printf "watchNamespaces: the operator watches one namespace or all of them (--watch-namespace takes one); got %d: %s. List one namespace, or none for all namespaces." (len .Values.watchNamespaces) (join ", " .Values.watchNamespaces)) }}
{{- end }}
{{- first .Values.watchNamespaces | default "" }}
{{- end }}

{{/*
What the operator does with the API (crates/operator: controller.rs, apply.rs), and nothing else.
Shared by the ClusterRole (all namespaces) and the Role (one namespace).
*/}}
{{- define "burst-prefix.operatorRules" -}}
# BurstPrefixPolicies: watched (list, watch); the status written by server-side apply.
- apiGroups: ["burstprefix.io"]
  resources: ["burstprefixpolicies"]
  verbs: ["list", "watch"]
- apiGroups: ["burstprefix.io"]
  resources: ["burstprefixpolicies/status"]
  verbs: ["patch"]
# The inference pods: listed in every reconcile, and watched.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list", "watch"]
# InferencePools (poolRef): read in reconcile, watched when the API is served.
- apiGroups: ["inference.networking.k8s.io"]
  resources: ["inferencepools"]
  verbs: ["get", "list", "watch"]
# The children of a policy: watched (list, watch), written by server-side apply (patch, plus
# create when the object is new). Nothing is ever deleted: owner references let the garbage
# collector do that.
# configmaps also need get: the producer's Role grants get, list, watch on its ConfigMap, and
# RBAC lets the operator grant only what it holds itself. deployments: get, read back in reconcile.
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["get", "list", "watch", "create", "patch"]
- apiGroups: [""]
  resources: ["services", "serviceaccounts"]
  verbs: ["list", "watch", "create", "patch"]
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["get", "list", "watch", "create", "patch"]
- apiGroups: ["rbac.authorization.k8s.io"]
  resources: ["roles", "rolebindings"]
  verbs: ["list", "watch", "create", "patch"]
{{- end }}
