//! hcp-olm-e2e
