module hcp-olm/e2e/tools/pause

go 1.26.3
