package objects

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// RelatedHash is the hash of a related object's content as it crosses to
// the other side (RelatedContent), without apiVersion and kind (the edge
// re-types kcp-origin objects to their local version). The broker hashes
// the kcp object it sends, the edge the content it applies and, to notice
// local edits, the fields its field manager owns on the copy: all three
// agree while the copy holds what kcp holds. encoding/json orders map keys,
// so equal content gives equal hashes.
func RelatedHash(obj *unstructured.Unstructured) string {
	content := RelatedContent(obj).Object
	delete(content, "apiVersion")
	delete(content, "kind")
	data, err := json.Marshal(content)
	if err != nil {
		// Not JSON-encodable (never from an API server): a hash nothing
		// matches, so the object is sent or written again.
		return "unencodable"
	}
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:16])
}
