//! hcp-olm-guest-agent
