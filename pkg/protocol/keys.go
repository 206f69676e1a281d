package protocol

import ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"

// ObjectKeyString is the map key both sides use for an object:
// cluster, group/resource, namespace, name and UID.
func ObjectKeyString(k *ferryv1.ObjectKey) string {
	r := k.GetResource()
	return k.GetCluster() + "|" + r.GetGroup() + "/" + r.GetResource() + "|" + k.GetNamespace() + "|" + k.GetName() + "|" + k.GetUid()
}

// IntentKey is the map key both sides use for a sync intent: the object, or
// for a related object its primary and related[] entry (one slot per
// reference, whichever object it points at). Only the latest intent per key
// matters.
func IntentKey(key *ferryv1.ObjectKey, relatedTo *ferryv1.RelatedTo) string {
	if relatedTo != nil {
		return "related|" + ObjectKeyString(relatedTo.GetPrimary()) + "|" + relatedTo.GetIdentifier()
	}
	return ObjectKeyString(key)
}
