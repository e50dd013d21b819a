package contract

// The upload server's outcome endpoint (Kubefill's; CDI's upload server
// has none). The controller asks it so as to learn that a host-assisted
// clone is complete as soon as the data is durable, instead of once the
// kubelet has noticed the upload pod's exit (up to a second or more later).
//
// GET UploadOutcomePath?wait=<Go duration> answers 200 with the JSON
// TerminationMessage the server writes on exit (Outcome Succeeded), once an
// upload has succeeded, that is once its data is fsynced; it answers 204 if
// none has after waiting up to wait (at most UploadOutcomeMaxWait) for one.
// Failures are not reported here: they reach the controller through the
// pod's termination message, as before. The server's certificate (issued
// for its Service) is what makes the answer trustworthy: the controller
// verifies it against the upload server CA and the Service's name.
const (
	UploadOutcomePath = "/kubefill/v1/outcome"
	// UploadOutcomeMaxWait bounds the wait query parameter, in seconds.
	UploadOutcomeMaxWait = 60
)
