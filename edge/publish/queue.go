package publish

import (
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// workqueueOfRequests is the controller's queue type.
type workqueueOfRequests = workqueue.TypedRateLimitingInterface[reconcile.Request]
