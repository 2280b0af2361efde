{{/*
Names, labels and the addresses the tiers use to find each other. Only include, default,
printf, trunc, trimSuffix, toYaml, required, quote, nindent and indent are used in this chart
(see README.md).
*/}}

{{- define "mqgw.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The release's prefix for every object: RELEASE-mqgw, or RELEASE if it holds the name. */}}
{{- define "mqgw.fullname" -}}
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

{{- define "mqgw.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "mqgw.labels" -}}
helm.sh/chart: {{ include "mqgw.chart" . }}
{{ include "mqgw.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "mqgw.selectorLabels" -}}
app.kubernetes.io/name: {{ include "mqgw.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Per tier: include "mqgw.componentLabels" (list . "broker") */}}
{{- define "mqgw.componentLabels" -}}
{{ include "mqgw.labels" (index . 0) }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end }}

{{- define "mqgw.componentSelector" -}}
{{ include "mqgw.selectorLabels" (index . 0) }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end }}

{{- define "mqgw.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{- define "mqgw.redisService" -}}
{{- printf "%s-redis" (include "mqgw.fullname" .) }}
{{- end }}

{{- define "mqgw.brokerService" -}}
{{- printf "%s-broker" (include "mqgw.fullname" .) }}
{{- end }}

{{- define "mqgw.gatewayService" -}}
{{- printf "%s-gateway" (include "mqgw.fullname" .) }}
{{- end }}

{{- define "mqgw.configMap" -}}
{{- printf "%s-config" (include "mqgw.fullname" .) }}
{{- end }}

{{/* --meta for every mqgw process: the chart's Redis Service, or redis.externalUrl. */}}
{{- define "mqgw.metaUrl" -}}
{{- if .Values.redis.enabled }}
{{- printf "redis://%s:%d/%d" (include "mqgw.redisService" .) (int .Values.redis.port) (int .Values.redis.db) }}
{{- else }}
{{- required "redis.externalUrl is required when redis.enabled is false" .Values.redis.externalUrl }}
{{- end }}
{{- end }}

{{/* Env entries every mqgw container gets: its pod's name and namespace. */}}
{{- define "mqgw.podEnv" -}}
- name: POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
- name: POD_NAMESPACE
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
{{- end }}

{{/* The MQGW_* settings of the ConfigMap, as environment. */}}
{{- define "mqgw.envFrom" -}}
envFrom:
  - configMapRef:
      name: {{ include "mqgw.configMap" . }}
{{- end }}

{{/* Scheduling and pull secrets: include "mqgw.podScheduling" (list . .Values.brokers) */}}
{{- define "mqgw.podScheduling" -}}
{{- $root := index . 0 }}
{{- $tier := index . 1 }}
{{- with $root.Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $tier.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $tier.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $tier.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}
