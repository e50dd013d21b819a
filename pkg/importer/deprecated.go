package importer

import "github.com/kubefill/kubefill/pkg/contract"

// Names that moved to pkg/contract, kept while pkg/populators and tests/
// still use them here. They go once nothing does.

// Deprecated: use contract.Env*.
const (
	EnvSource                = contract.EnvSource
	EnvEndpoint              = contract.EnvEndpoint
	EnvContentType           = contract.EnvContentType
	EnvImageSize             = contract.EnvImageSize
	EnvAccessKeyID           = contract.EnvAccessKeyID
	EnvSecretKey             = contract.EnvSecretKey
	EnvCertDir               = contract.EnvCertDir
	EnvHTTPProxy             = contract.EnvHTTPProxy
	EnvHTTPSProxy            = contract.EnvHTTPSProxy
	EnvNoProxy               = contract.EnvNoProxy
	EnvExtraHeaderPrefix     = contract.EnvExtraHeaderPrefix
	EnvSecretExtraHeadersDir = contract.EnvSecretExtraHeadersDir
	EnvChecksum              = contract.EnvChecksum
	EnvRegistryArchitecture  = contract.EnvRegistryArchitecture
	EnvFilesystemOverhead    = contract.EnvFilesystemOverhead
	EnvPreallocation         = contract.EnvPreallocation
	EnvOwnerUID              = contract.EnvOwnerUID
)

// Deprecated: use contract.Source*.
const (
	SourceHTTP     = contract.SourceHTTP
	SourceS3       = contract.SourceS3
	SourceRegistry = contract.SourceRegistry
	SourceNone     = contract.SourceNone
)

// Deprecated: use contract.BlockPath and contract.ScratchDir.
const (
	DefaultBlockPath  = contract.BlockPath
	DefaultScratchDir = contract.ScratchDir
)

// Deprecated: use contract.OutcomeSucceeded.
const OutcomeSucceeded = contract.OutcomeSucceeded

// Deprecated: use contract.MessageImportComplete.
const MessageImportComplete = contract.MessageImportComplete

// Deprecated: use contract.ImportProgressMetric.
const ProgressMetricName = contract.ImportProgressMetric
