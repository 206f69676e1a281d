// Package publish is the edge's half of publishing. Its controller watches
// PublishedResources and the CRDs they name in the service cluster,
// validates each PublishedResource locally (CRD and versions exist,
// projection valid, no two PublishedResources projecting onto the same
// resource or publishing the same CRD, no change of the served resource once
// published), hands the resulting Publish to the Store, and writes the
// broker's answer into the PublishedResource's Published condition.
//
// Invariants: a PublishedResource that fails validation is withdrawn from
// the broker (its schema stays in kcp), except a published one whose
// projection changed, which stays registered and sent as published; only
// the published owner of a CRD deletes its local copies; a CRD that appears or changes later
// is picked up by the CRD watch without restart; the controller never blocks
// on the network — the Store decouples it from the broker stream.
package publish
