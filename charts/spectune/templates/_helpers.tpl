{{/* The chart name. */}}
{{- define "spectune.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The full name of the release's objects. */}}
{{- define "spectune.fullname" -}}
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

{{/* Labels that select the operator pod. */}}
{{- define "spectune.selectorLabels" -}}
app.kubernetes.io/name: {{ include "spectune.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{/* The standard labels of every object. */}}
{{- define "spectune.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "spectune.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: spectune
{{- end -}}

{{/* The ServiceAccount's name. */}}
{{- define "spectune.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "spectune.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The operator image: [registry/]repository:tag; the registry is global.imageRegistry (an
umbrella chart's), else image.registry, else none. */}}
{{- define "spectune.image" -}}
{{- $registry := (.Values.global | default dict).imageRegistry | default .Values.image.registry -}}
{{- $repo := .Values.image.repository -}}
{{- if $registry -}}
{{- $repo = printf "%s/%s" (trimSuffix "/" $registry) $repo -}}
{{- end -}}
{{- printf "%s:%s" $repo (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* The image pull secrets: imagePullSecrets and global.imagePullSecrets, once each. */}}
{{- define "spectune.imagePullSecrets" -}}
{{- $all := concat (.Values.imagePullSecrets | default list) ((.Values.global | default dict).imagePullSecrets | default list) | uniq -}}
{{- with $all }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end -}}
{{- end -}}

{{/*
Fail unless the cluster serves a Prometheus Operator kind: the value that asked for it, the
kind, and the fix. `helm template` knows the cluster's APIs only from --api-versions.
*/}}
{{- define "spectune.requireMonitoringKind" -}}
{{- $kind := index . 0 -}}
{{- $value := index . 1 -}}
{{- $ctx := index . 2 -}}
{{- if not ($ctx.Capabilities.APIVersions.Has (printf "monitoring.coreos.com/v1/%s" $kind)) -}}
{{- fail (printf "%s.enabled=true but the cluster serves no monitoring.coreos.com/v1 %s: install the Prometheus Operator's CRDs (kube-prometheus-stack does), or set %s.enabled=false; with helm template, pass --api-versions monitoring.coreos.com/v1/%s" $value $kind $value $kind) -}}
{{- end -}}
{{- end -}}

{{/*
The namespaces the operator watches, comma-separated: watchNamespaces, or the release namespace
when none is given; empty with clusterWide (every namespace). clusterWide together with a
namespace list is refused: the two say opposite things about what the operator may touch.
*/}}
{{- define "spectune.watchNamespaces" -}}
{{- if .Values.clusterWide -}}
{{- if .Values.watchNamespaces -}}
{{- fail (printf "clusterWide: true and watchNamespaces: %v are both set: choose one (clusterWide=true watches every namespace, kube-system included; watchNamespaces only those listed)" .Values.watchNamespaces) -}}
{{- end -}}
{{- else -}}
{{- join "," (default (list .Release.Namespace) .Values.watchNamespaces) -}}
{{- end -}}
{{- end -}}

{{/* The name of the kopf peering object (KopfPeering or ClusterKopfPeering); empty: standalone. */}}
{{- define "spectune.peeringName" -}}
{{- if gt (int .Values.replicas) 1 -}}
{{- include "spectune.fullname" . -}}
{{- end -}}
{{- end -}}

{{/* The labels of the `helm test` Job and its pod: not the operator's selector labels. */}}
{{- define "spectune.testLabels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/name: {{ include "spectune.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: test
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: spectune
{{- end -}}
