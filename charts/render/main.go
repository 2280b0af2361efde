// Command render renders a Helm 3 chart the way `helm template` does, for CI machines where
// Helm itself cannot be installed. It is built offline from Debian's packages:
//
//	GO111MODULE=off GOPATH=/usr/share/gocode go build -o build/chart-render/render ./charts/render
//
// (golang-go, golang-github-masterminds-sprig-dev, golang-k8s-sigs-yaml-dev).
//
// Usage:
//
//	render [--name RELEASE] [--namespace NS] [-f values.yaml]... [--set a.b=v]... CHART_DIR
//
// What it shares with Helm 3's engine (helm.sh/helm/v3/pkg/engine):
//   - one text/template set holding every file under templates/, parsed in Helm's order
//     (deepest path first, then by name), with missingkey=zero and "<no value>" erased;
//   - files whose name starts with "_" are parsed but not rendered, NOTES.txt is not output;
//   - the functions: sprig's TxtFuncMap without env/expandenv, plus include, required,
//     toYaml, toJson, fromYaml, fromJson (same code paths as Helm's);
//   - values: values.yaml read with sigs.k8s.io/yaml (numbers become float64, as in Helm),
//     then each -f file and --set coalesced over it (a null deletes a key);
//   - .Values, .Release (Name, Namespace, Revision 1, IsInstall, IsUpgrade, Service "Helm"),
//     .Chart (Chart.yaml's fields under Helm's names), .Template (Name, BasePath).
//
// What it does not have, so a chart that uses it fails here instead of rendering
// differently: tpl, lookup, toToml, .Files, .Capabilities, subcharts, values.schema.json.
// Output: each manifest as "---\n# Source: CHART/templates/FILE\n" + the document, files in
// name order (Helm sorts by kind; the content is the same).
package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"text/template"

	"github.com/Masterminds/sprig"
	"sigs.k8s.io/yaml"
)

// Maintainer is chart.Maintainer.
type Maintainer struct {
	Name  string `json:"name,omitempty"`
	Email string `json:"email,omitempty"`
	URL   string `json:"url,omitempty"`
}

// Metadata is Helm's chart.Metadata: what templates see as .Chart.
type Metadata struct {
	Name        string            `json:"name,omitempty"`
	Home        string            `json:"home,omitempty"`
	Sources     []string          `json:"sources,omitempty"`
	Version     string            `json:"version,omitempty"`
	Description string            `json:"description,omitempty"`
	Keywords    []string          `json:"keywords,omitempty"`
	Maintainers []*Maintainer     `json:"maintainers,omitempty"`
	Icon        string            `json:"icon,omitempty"`
	APIVersion  string            `json:"apiVersion,omitempty"`
	Condition   string            `json:"condition,omitempty"`
	Tags        string            `json:"tags,omitempty"`
	AppVersion  string            `json:"appVersion,omitempty"`
	Deprecated  bool              `json:"deprecated,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
	KubeVersion string            `json:"kubeVersion,omitempty"`
	Type        string            `json:"type,omitempty"`
}

type multiFlag []string

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintf(os.Stderr, "render: %v\n", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	release, namespace := "release-name", "default"
	var valueFiles, sets multiFlag
	var chartDir string
	for i := 0; i < len(args); i++ {
		arg := args[i]
		next := func() (string, error) {
			if i+1 >= len(args) {
				return "", fmt.Errorf("%s needs a value", arg)
			}
			i++
			return args[i], nil
		}
		var err error
		var v string
		switch arg {
		case "--name", "--namespace", "-f", "--values", "--set":
			if v, err = next(); err != nil {
				return err
			}
		}
		switch {
		case arg == "--name":
			release = v
		case arg == "--namespace":
			namespace = v
		case arg == "-f" || arg == "--values":
			valueFiles = append(valueFiles, v)
		case arg == "--set":
			sets = append(sets, v)
		case arg == "-h" || arg == "--help":
			fmt.Println("usage: render [--name RELEASE] [--namespace NS] [-f values.yaml]... [--set a.b=v]... CHART_DIR")
			return nil
		case strings.HasPrefix(arg, "-"):
			return fmt.Errorf("unknown option %s", arg)
		case chartDir == "":
			chartDir = arg
		default:
			return fmt.Errorf("one chart directory only (got %s and %s)", chartDir, arg)
		}
	}
	if chartDir == "" {
		return errors.New("no chart directory given")
	}
	out, err := render(chartDir, release, namespace, valueFiles, sets)
	if err != nil {
		return err
	}
	_, err = os.Stdout.WriteString(out)
	return err
}

func render(chartDir, release, namespace string, valueFiles, sets []string) (string, error) {
	meta, err := loadChart(chartDir)
	if err != nil {
		return "", err
	}
	values, err := readValues(filepath.Join(chartDir, "values.yaml"), true)
	if err != nil {
		return "", err
	}
	for _, file := range valueFiles {
		override, err := readValues(file, false)
		if err != nil {
			return "", err
		}
		coalesce(values, override)
	}
	for _, set := range sets {
		if err := applySet(values, set); err != nil {
			return "", err
		}
	}
	templates, err := readTemplates(chartDir, meta.Name)
	if err != nil {
		return "", err
	}
	top := map[string]interface{}{
		"Values": values,
		"Chart":  meta,
		"Release": map[string]interface{}{
			"Name":      release,
			"Namespace": namespace,
			"Revision":  1,
			"IsInstall": true,
			"IsUpgrade": false,
			"Service":   "Helm",
		},
	}
	rendered, err := execute(templates, top, meta.Name+"/templates")
	if err != nil {
		return "", err
	}
	return manifests(rendered), nil
}

func loadChart(dir string) (*Metadata, error) {
	data, err := os.ReadFile(filepath.Join(dir, "Chart.yaml"))
	if err != nil {
		return nil, err
	}
	meta := &Metadata{}
	if err := yaml.UnmarshalStrict(data, meta); err != nil {
		return nil, fmt.Errorf("Chart.yaml: %v", err)
	}
	if meta.APIVersion != "v2" {
		return nil, fmt.Errorf("Chart.yaml: apiVersion must be v2 (Helm 3), not %q", meta.APIVersion)
	}
	if meta.Name == "" || meta.Version == "" {
		return nil, errors.New("Chart.yaml: name and version are required")
	}
	return meta, nil
}

// readValues reads a values file as Helm's chartutil.ReadValues does (sigs.k8s.io/yaml, so
// numbers are float64). A missing values.yaml in the chart is an empty table.
func readValues(file string, optional bool) (map[string]interface{}, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		if optional && os.IsNotExist(err) {
			return map[string]interface{}{}, nil
		}
		return nil, err
	}
	values := map[string]interface{}{}
	if err := yaml.Unmarshal(data, &values); err != nil {
		return nil, fmt.Errorf("%s: %v", file, err)
	}
	if values == nil {
		values = map[string]interface{}{}
	}
	return values, nil
}

// coalesce puts override over base the way Helm coalesces user values over the chart's:
// tables merge key by key, anything else replaces, and a null deletes the key.
func coalesce(base, override map[string]interface{}) {
	for key, value := range override {
		if value == nil {
			delete(base, key)
			continue
		}
		sub, isTable := value.(map[string]interface{})
		current, wasTable := base[key].(map[string]interface{})
		if isTable && wasTable {
			coalesce(current, sub)
			continue
		}
		base[key] = value
	}
}

var intPattern = regexp.MustCompile(`^-?(0|[1-9][0-9]*)$`)

// applySet applies one --set a.b=v[,c=w]: values typed as Helm's strvals types them (int64,
// bool, null, else string). List indexes (a[0]) are not supported.
func applySet(values map[string]interface{}, set string) error {
	for _, pair := range strings.Split(set, ",") {
		key, raw, found := strings.Cut(pair, "=")
		if !found || key == "" || strings.ContainsAny(key, "[]") {
			return fmt.Errorf("--set %q: want key.path=value (no list indexes)", pair)
		}
		var value interface{} = raw
		switch {
		case raw == "true":
			value = true
		case raw == "false":
			value = false
		case raw == "null":
			value = nil
		case intPattern.MatchString(raw):
			if n, err := strconv.ParseInt(raw, 10, 64); err == nil {
				value = n
			}
		}
		parts := strings.Split(key, ".")
		table := values
		for _, part := range parts[:len(parts)-1] {
			sub, ok := table[part].(map[string]interface{})
			if !ok {
				sub = map[string]interface{}{}
				table[part] = sub
			}
			table = sub
		}
		coalesce(table, map[string]interface{}{parts[len(parts)-1]: value})
	}
	return nil
}

// readTemplates returns every file under templates/ by its Helm name (CHART/templates/REL).
func readTemplates(chartDir, chartName string) (map[string]string, error) {
	root := filepath.Join(chartDir, "templates")
	templates := map[string]string{}
	err := filepath.Walk(root, func(file string, info os.FileInfo, err error) error {
		if err != nil || info.IsDir() {
			return err
		}
		rel, err := filepath.Rel(root, file)
		if err != nil {
			return err
		}
		data, err := os.ReadFile(file)
		if err != nil {
			return err
		}
		templates[path.Join(chartName, "templates", filepath.ToSlash(rel))] = string(data)
		return nil
	})
	return templates, err
}

// sortTemplates is Helm's parse order: deeper paths first, then reverse lexical order.
func sortTemplates(templates map[string]string) []string {
	keys := make([]string, 0, len(templates))
	for key := range templates {
		keys = append(keys, key)
	}
	sort.Slice(keys, func(i, j int) bool {
		a, b := keys[i], keys[j]
		ca, cb := strings.Count(a, "/"), strings.Count(b, "/")
		if ca == cb {
			return a > b
		}
		return ca > cb
	})
	return keys
}

const recursionMax = 1000

func funcMap(t *template.Template) template.FuncMap {
	f := sprig.TxtFuncMap()
	delete(f, "env")
	delete(f, "expandenv")
	included := map[string]int{}
	f["include"] = func(name string, data interface{}) (string, error) {
		if included[name] > recursionMax {
			return "", fmt.Errorf("rendering template has a nested reference name: %s", name)
		}
		included[name]++
		defer func() { included[name]-- }()
		var buf strings.Builder
		err := t.ExecuteTemplate(&buf, name, data)
		return buf.String(), err
	}
	f["required"] = func(warn string, val interface{}) (interface{}, error) {
		if val == nil {
			return val, errors.New(warn)
		}
		if s, ok := val.(string); ok && s == "" {
			return val, errors.New(warn)
		}
		return val, nil
	}
	f["toYaml"] = func(v interface{}) string {
		data, err := yaml.Marshal(v)
		if err != nil {
			return ""
		}
		return strings.TrimSuffix(string(data), "\n")
	}
	f["toJson"] = func(v interface{}) string {
		data, err := json.Marshal(v)
		if err != nil {
			return ""
		}
		return string(data)
	}
	f["fromYaml"] = func(s string) map[string]interface{} {
		m := map[string]interface{}{}
		if err := yaml.Unmarshal([]byte(s), &m); err != nil {
			m["Error"] = err.Error()
		}
		return m
	}
	return f
}

func execute(templates map[string]string, top map[string]interface{}, basePath string) (map[string]string, error) {
	t := template.New("gotpl").Option("missingkey=zero")
	t.Funcs(funcMap(t))
	keys := sortTemplates(templates)
	for _, name := range keys {
		if _, err := t.New(name).Parse(templates[name]); err != nil {
			return nil, err
		}
	}
	rendered := map[string]string{}
	for _, name := range keys {
		if strings.HasPrefix(path.Base(name), "_") {
			continue
		}
		vals := map[string]interface{}{}
		for k, v := range top {
			vals[k] = v
		}
		vals["Template"] = map[string]interface{}{"Name": name, "BasePath": basePath}
		var buf strings.Builder
		if err := t.ExecuteTemplate(&buf, name, vals); err != nil {
			return nil, err
		}
		rendered[name] = strings.ReplaceAll(buf.String(), "<no value>", "")
	}
	return rendered, nil
}

var separator = regexp.MustCompile(`(?:^|\s*\n)---\s*`)

// manifests joins the rendered files as `helm template` prints them, one document at a time.
func manifests(rendered map[string]string) string {
	names := make([]string, 0, len(rendered))
	for name := range rendered {
		if strings.HasSuffix(name, "NOTES.txt") {
			continue
		}
		names = append(names, name)
	}
	sort.Strings(names)
	var out strings.Builder
	for _, name := range names {
		for _, doc := range separator.Split(rendered[name], -1) {
			doc = strings.TrimSpace(doc)
			if doc == "" {
				continue
			}
			fmt.Fprintf(&out, "---\n# Source: %s\n%s\n", name, doc)
		}
	}
	return out.String()
}
