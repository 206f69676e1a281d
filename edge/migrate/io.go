package migrate

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/yaml"
)

// sourceResources are the ancestors' PublishedResource resources, read from
// a live cluster.
var sourceResources = []schema.GroupVersionResource{
	{Group: "syncagent.kcp.io", Version: "v1alpha1", Resource: "publishedresources"},
	{Group: "services.kdp.k8c.io", Version: "v1alpha1", Resource: "publishedresources"},
}

// ReadDocuments reads every YAML or JSON document of r, skipping empty ones
// and unwrapping Lists (kubectl get -o yaml writes one).
func ReadDocuments(r io.Reader) ([]map[string]any, error) {
	reader := utilyaml.NewYAMLReader(bufio.NewReader(r))
	var docs []map[string]any
	for i := 1; ; i++ {
		raw, err := reader.Read()
		if errors.Is(err, io.EOF) {
			return docs, nil
		}
		if err != nil {
			return nil, fmt.Errorf("document %d: %w", i, err)
		}
		if len(bytes.TrimSpace(raw)) == 0 {
			continue
		}
		var doc map[string]any
		if err := yaml.Unmarshal(raw, &doc); err != nil {
			return nil, fmt.Errorf("document %d: %w", i, err)
		}
		if doc == nil {
			continue
		}
		if items, ok := doc["items"].([]any); ok && strings.HasSuffix(fmt.Sprint(doc["kind"]), "List") {
			for j, it := range items {
				m, ok := it.(map[string]any)
				if !ok {
					return nil, fmt.Errorf("document %d: items[%d] is not an object", i, j)
				}
				docs = append(docs, m)
			}
			continue
		}
		docs = append(docs, doc)
	}
}

// FromCluster lists the ancestors' PublishedResources of a live cluster. A
// cluster without one of the two APIs is not an error; one without both is.
func FromCluster(ctx context.Context, client dynamic.Interface) ([]map[string]any, error) {
	var docs []map[string]any
	served := 0
	for _, gvr := range sourceResources {
		list, err := client.Resource(gvr).List(ctx, metav1.ListOptions{})
		if apierrors.IsNotFound(err) || meta.IsNoMatchError(err) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("listing %s: %w", gvr.GroupResource(), err)
		}
		served++
		for i := range list.Items {
			docs = append(docs, list.Items[i].Object)
		}
	}
	if served == 0 {
		return nil, fmt.Errorf("the cluster serves neither %s nor %s", sourceResources[0].GroupResource(), sourceResources[1].GroupResource())
	}
	return docs, nil
}

// Write writes the converted documents as a YAML stream; each document is
// preceded by comments listing its changes, so the output explains itself.
func Write(w io.Writer, results []Result) error {
	var buf bytes.Buffer
	for i, r := range results {
		if i > 0 {
			buf.WriteString("---\n")
		}
		fmt.Fprintf(&buf, "# PublishedResource %q migrated from %s by ferry-edge migrate\n", r.Name, r.From)
		for _, c := range r.Changes {
			fmt.Fprintf(&buf, "#   %s\n", c)
		}
		out, err := yaml.Marshal(r.Object)
		if err != nil {
			return fmt.Errorf("PublishedResource %q: %w", r.Name, err)
		}
		buf.Write(out)
	}
	_, err := w.Write(buf.Bytes())
	return err
}
