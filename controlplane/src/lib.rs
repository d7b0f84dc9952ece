//! hcp-olm-controlplane
