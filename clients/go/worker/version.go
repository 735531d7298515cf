package worker

// Version is the release of leaseq this module belongs to: the version of
// every package in the repository (tests/release.rs checks they agree). A
// Go module's own version is its git tag, clients/go/vVERSION.
const Version = "0.2.0"
