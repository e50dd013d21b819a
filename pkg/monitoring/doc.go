// Package monitoring holds the checks of Kubefill's Prometheus rules
// (manifests/monitoring): CDI's recording rules and alerts, whose
// expressions must parse and must name only metrics Kubefill exports, the
// recording rules themselves, or the few external metrics they are built on.
package monitoring
