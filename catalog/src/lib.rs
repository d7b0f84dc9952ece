//! hcp-olm-catalog
