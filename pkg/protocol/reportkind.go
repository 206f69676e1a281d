package protocol

// Kinds of edge reports, as metrics label them and the broker's Observer
// names them.
const (
	ReportKindStatus   = "status"
	ReportKindRelated  = "related"
	ReportKindDeletion = "deletion"
	ReportKindResend   = "resend"
)
