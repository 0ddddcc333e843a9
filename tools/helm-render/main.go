// helm-render: renders a Helm chart the way `helm template` does, for CI machines without helm.
//
// It implements the subset of Helm that helm/tinyserve uses, with Helm's semantics:
//   - every file under templates/ is parsed into one template set (so _helpers.tpl defines are
//     visible everywhere); files whose name starts with "_" and NOTES.txt produce no manifest;
//   - functions: text/template builtins, sprig (less env/expandenv, as in Helm), include, tpl,
//     required, toYaml, fromYaml, toJson, fromJson, toToml-free; lookup returns an empty map;
//   - .Values (values.yaml deep-merged with each -f file, then --set key.path=value),
//     .Release, .Chart (Chart.yaml with Helm's capitalised field names), .Capabilities
//     (KubeVersion and APIVersions.Has), .Template, .Files (Get, GetBytes, Glob, Lines, AsConfig);
//   - missingkey=zero and "<no value>" replaced by "", as Helm does;
//   - output: "---\n# Source: <chart>/templates/<file>\n<manifest>" for each non-empty file.
//
// Build (GOPATH mode, Debian packages golang-go golang-github-masterminds-sprig-dev
// golang-k8s-sigs-yaml-dev):
//
//	GO111MODULE=off GOPATH=$TMP/gopath:/usr/share/gocode go build -o helm-render tools/helm-render/main.go
//
// Usage:
//
//	helm-render [--name R] [--namespace N] [-f values.yaml]... [--set a.b=c]... [--kube-version 1.30.0]
//	            [--api-versions group/version]... [--show-values] [--notes] CHART_DIR
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"text/template"

	"github.com/Masterminds/sprig"
	"sigs.k8s.io/yaml"
)

type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, ",") }
func (m *multiFlag) Set(v string) error { *m = append(*m, v); return nil }

// Files is the chart's non-template files, keyed by path relative to the chart root.
type Files map[string][]byte

func (f Files) GetBytes(name string) []byte { return f[name] }
func (f Files) Get(name string) string      { return string(f[name]) }

// Glob returns the files matching a path.Match pattern ("**" is not supported; the chart does
// not use it).
func (f Files) Glob(pattern string) Files {
	out := Files{}
	for name, data := range f {
		if ok, _ := path.Match(pattern, name); ok {
			out[name] = data
		}
	}
	return out
}

func (f Files) Lines(name string) []string {
	s := string(f[name])
	if s == "" {
		return []string{}
	}
	return strings.Split(strings.TrimSuffix(s, "\n"), "\n")
}

// AsConfig renders the files as a YAML map of base name to content (ConfigMap data).
func (f Files) AsConfig() string {
	m := map[string]string{}
	for name, data := range f {
		m[path.Base(name)] = string(data)
	}
	return toYAML(m)
}

type APIVersions []string

func (a APIVersions) Has(v string) bool {
	for _, x := range a {
		if x == v {
			return true
		}
	}
	return false
}

type KubeVersion struct {
	Version    string
	Major      string
	Minor      string
	GitVersion string
}

func (k KubeVersion) String() string { return k.Version }

type Capabilities struct {
	KubeVersion KubeVersion
	APIVersions APIVersions
}

type TemplateInfo struct {
	Name     string
	BasePath string
}

func toYAML(v interface{}) string {
	data, err := yaml.Marshal(v)
	if err != nil {
		return ""
	}
	return strings.TrimSuffix(string(data), "\n")
}

func fromYAML(s string) map[string]interface{} {
	m := map[string]interface{}{}
	if err := yaml.Unmarshal([]byte(s), &m); err != nil {
		m["Error"] = err.Error()
	}
	return m
}

func toJSON(v interface{}) string {
	data, err := json.Marshal(v)
	if err != nil {
		return ""
	}
	return string(data)
}

func fromJSON(s string) map[string]interface{} {
	m := map[string]interface{}{}
	if err := json.Unmarshal([]byte(s), &m); err != nil {
		m["Error"] = err.Error()
	}
	return m
}

// mergeValues deep-merges src into dst: maps merge key by key, anything else replaces; a null in
// src deletes the key (Helm's behaviour for user-supplied values).
func mergeValues(dst, src map[string]interface{}) map[string]interface{} {
	for k, v := range src {
		if v == nil {
			delete(dst, k)
			continue
		}
		sm, sok := v.(map[string]interface{})
		dm, dok := dst[k].(map[string]interface{})
		if sok && dok {
			dst[k] = mergeValues(dm, sm)
		} else {
			dst[k] = v
		}
	}
	return dst
}

// setValue applies one --set a.b.c=value (value parsed as int, bool, null or string).
func setValue(values map[string]interface{}, expr string) error {
	eq := strings.Index(expr, "=")
	if eq <= 0 {
		return fmt.Errorf("--set %q: want key=value", expr)
	}
	keys := strings.Split(expr[:eq], ".")
	raw := expr[eq+1:]
	var val interface{} = raw
	if i, err := strconv.ParseInt(raw, 10, 64); err == nil {
		val = float64(i) // values from YAML are float64 too (JSON numbers)
	} else if raw == "true" || raw == "false" {
		val = raw == "true"
	} else if raw == "null" {
		val = nil
	}
	m := values
	for _, k := range keys[:len(keys)-1] {
		next, ok := m[k].(map[string]interface{})
		if !ok {
			next = map[string]interface{}{}
			m[k] = next
		}
		m = next
	}
	if val == nil {
		delete(m, keys[len(keys)-1])
	} else {
		m[keys[len(keys)-1]] = val
	}
	return nil
}

func readYAMLMap(file string) (map[string]interface{}, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	m := map[string]interface{}{}
	if err := yaml.Unmarshal(data, &m); err != nil {
		return nil, fmt.Errorf("%s: %v", file, err)
	}
	return m, nil
}

// chartMeta maps Chart.yaml (lowerCamel keys) to Helm's .Chart fields (UpperCamel).
func chartMeta(raw map[string]interface{}) map[string]interface{} {
	out := map[string]interface{}{}
	for k, v := range raw {
		out[strings.ToUpper(k[:1])+k[1:]] = v
	}
	// Fields templates commonly read must exist even when Chart.yaml omits them.
	for _, k := range []string{"Name", "Version", "AppVersion", "Description", "Type", "KubeVersion"} {
		if _, ok := out[k]; !ok {
			out[k] = ""
		}
	}
	return out
}

type renderer struct {
	chartName string
	tmpl      *template.Template
	funcs     template.FuncMap
}

func (r *renderer) funcMap() template.FuncMap {
	f := sprig.TxtFuncMap()
	delete(f, "env")
	delete(f, "expandenv")
	f["toYaml"] = toYAML
	f["fromYaml"] = fromYAML
	f["toJson"] = toJSON
	f["fromJson"] = fromJSON
	f["required"] = func(msg string, v interface{}) (interface{}, error) {
		if v == nil {
			return nil, errors.New(msg)
		}
		if s, ok := v.(string); ok && s == "" {
			return nil, errors.New(msg)
		}
		return v, nil
	}
	f["fail"] = func(msg string) (string, error) { return "", errors.New(msg) }
	f["lookup"] = func(string, string, string, string) (map[string]interface{}, error) {
		return map[string]interface{}{}, nil
	}
	// include and tpl need the template set; they are bound late (below) like Helm does.
	f["include"] = func(string, interface{}) (string, error) { return "", errors.New("include not bound") }
	f["tpl"] = func(string, interface{}) (string, error) { return "", errors.New("tpl not bound") }
	return f
}

func (r *renderer) bind() {
	r.funcs["include"] = func(name string, data interface{}) (string, error) {
		var buf bytes.Buffer
		if err := r.tmpl.ExecuteTemplate(&buf, name, data); err != nil {
			return "", err
		}
		return buf.String(), nil
	}
	r.funcs["tpl"] = func(text string, data interface{}) (string, error) {
		t, err := r.tmpl.Clone()
		if err != nil {
			return "", err
		}
		t, err = t.New("tpl").Funcs(r.funcs).Option("missingkey=zero").Parse(text)
		if err != nil {
			return "", fmt.Errorf("tpl: %v", err)
		}
		var buf bytes.Buffer
		if err := t.Execute(&buf, data); err != nil {
			return "", fmt.Errorf("tpl: %v", err)
		}
		return strings.ReplaceAll(buf.String(), "<no value>", ""), nil
	}
	r.tmpl.Funcs(r.funcs)
}

func run() error {
	var valueFiles, sets, apiVersions multiFlag
	name := flag.String("name", "tinyserve", "release name")
	namespace := flag.String("namespace", "default", "release namespace")
	kubeVersion := flag.String("kube-version", "1.30.0", "Kubernetes version for .Capabilities")
	showValues := flag.Bool("show-values", false, "print the merged values as JSON instead of manifests")
	notes := flag.Bool("notes", false, "also render templates/NOTES.txt (as a YAML comment block)")
	flag.Var(&valueFiles, "f", "values file (repeatable, later wins)")
	flag.Var(&sets, "set", "key.path=value (repeatable)")
	flag.Var(&apiVersions, "api-versions", "extra API version for .Capabilities.APIVersions (repeatable)")
	flag.Parse()
	if flag.NArg() != 1 {
		return errors.New("usage: helm-render [flags] CHART_DIR")
	}
	chartDir := flag.Arg(0)

	chartRaw, err := readYAMLMap(filepath.Join(chartDir, "Chart.yaml"))
	if err != nil {
		return err
	}
	chart := chartMeta(chartRaw)
	chartName, _ := chart["Name"].(string)
	if chartName == "" {
		return errors.New("Chart.yaml: name is required")
	}

	values := map[string]interface{}{}
	if _, err := os.Stat(filepath.Join(chartDir, "values.yaml")); err == nil {
		if values, err = readYAMLMap(filepath.Join(chartDir, "values.yaml")); err != nil {
			return err
		}
	}
	for _, f := range valueFiles {
		extra, err := readYAMLMap(f)
		if err != nil {
			return err
		}
		values = mergeValues(values, extra)
	}
	for _, s := range sets {
		if err := setValue(values, s); err != nil {
			return err
		}
	}
	if *showValues {
		data, _ := json.MarshalIndent(values, "", "  ")
		fmt.Println(string(data))
		return nil
	}

	// Non-template files for .Files (Helm excludes templates/, Chart.yaml and values.yaml from
	// nothing but templates/ — it keeps the others; we do the same).
	files := Files{}
	err = filepath.Walk(chartDir, func(p string, info os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(chartDir, p)
		rel = filepath.ToSlash(rel)
		if info.IsDir() {
			if rel == "templates" {
				return filepath.SkipDir
			}
			return nil
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		files[rel] = data
		return nil
	})
	if err != nil {
		return err
	}

	parts := strings.SplitN(strings.TrimPrefix(*kubeVersion, "v"), ".", 3)
	if len(parts) < 2 {
		return fmt.Errorf("--kube-version %q: want MAJOR.MINOR.PATCH", *kubeVersion)
	}
	apis := APIVersions{"v1", "apps/v1", "batch/v1", "policy/v1", "autoscaling/v2",
		"networking.k8s.io/v1", "rbac.authorization.k8s.io/v1"}
	apis = append(apis, apiVersions...)
	caps := Capabilities{
		KubeVersion: KubeVersion{Version: "v" + strings.TrimPrefix(*kubeVersion, "v"), Major: parts[0],
			Minor: parts[1], GitVersion: "v" + strings.TrimPrefix(*kubeVersion, "v")},
		APIVersions: apis,
	}
	release := map[string]interface{}{
		"Name": *name, "Namespace": *namespace, "Service": "Helm",
		"IsInstall": true, "IsUpgrade": false, "Revision": 1,
	}

	r := &renderer{chartName: chartName}
	r.funcs = r.funcMap()
	r.tmpl = template.New(chartName).Funcs(r.funcs).Option("missingkey=zero")

	tdir := filepath.Join(chartDir, "templates")
	var names []string
	err = filepath.Walk(tdir, func(p string, info os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		if info.IsDir() {
			return nil
		}
		rel, _ := filepath.Rel(chartDir, p)
		names = append(names, filepath.ToSlash(rel))
		return nil
	})
	if err != nil {
		return err
	}
	sort.Strings(names)
	for _, n := range names {
		data, err := os.ReadFile(filepath.Join(chartDir, n))
		if err != nil {
			return err
		}
		full := chartName + "/" + n
		if _, err := r.tmpl.New(full).Parse(string(data)); err != nil {
			return err
		}
	}
	r.bind()

	var out bytes.Buffer
	for _, n := range names {
		base := path.Base(n)
		isNotes := base == "NOTES.txt"
		if strings.HasPrefix(base, "_") || (isNotes && !*notes) {
			continue
		}
		if !isNotes && !strings.HasSuffix(base, ".yaml") && !strings.HasSuffix(base, ".yml") &&
			!strings.HasSuffix(base, ".tpl") {
			continue
		}
		full := chartName + "/" + n
		data := map[string]interface{}{
			"Values":       values,
			"Release":      release,
			"Chart":        chart,
			"Capabilities": caps,
			"Files":        files,
			"Template":     TemplateInfo{Name: full, BasePath: chartName + "/templates"},
		}
		var buf bytes.Buffer
		if err := r.tmpl.ExecuteTemplate(&buf, full, data); err != nil {
			return err
		}
		text := strings.ReplaceAll(buf.String(), "<no value>", "")
		if strings.TrimSpace(text) == "" {
			continue
		}
		if isNotes {
			out.WriteString("---\n# Source: " + full + "\n")
			for _, line := range strings.Split(strings.TrimRight(text, "\n"), "\n") {
				out.WriteString("# " + line + "\n")
			}
			continue
		}
		out.WriteString("---\n# Source: " + full + "\n")
		out.WriteString(strings.TrimLeft(text, "\n"))
		if !strings.HasSuffix(text, "\n") {
			out.WriteString("\n")
		}
	}
	_, err = os.Stdout.Write(out.Bytes())
	return err
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "helm-render: Error:", err)
		os.Exit(1)
	}
}
