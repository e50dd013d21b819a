package contract

// The upload pod's own address, handed to a running clone source pod
// (Kubefill's addition to CDI's cloner environment). The source pod starts
// beside the upload pod, before the latter has an address, so UPLOAD_URL
// names the upload Service's cluster IP; but a node's Service proxy routes
// a new pod's address some hundreds of milliseconds to seconds after the
// pod has it. The controller therefore writes the upload pod's address,
// once it has one, into the source pod's annotations, which a downward API
// volume shows as the file CloneUploadAddressFile ("<ip>:<port>", empty
// until known, rewritten if the upload pod is replaced). The cloner dials
// that address when the file names one, else UPLOAD_URL's, and verifies
// the server's certificate against UPLOAD_SERVER_NAME either way.
const (
	EnvCloneUploadAddressFile = "UPLOAD_ADDRESS_FILE"
	CloneUploadAddressDir     = "/etc/kubefill/upload-address"
	CloneUploadAddressFile    = CloneUploadAddressDir + "/address"
)
