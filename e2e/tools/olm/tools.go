//go:build tools

// Package tools pins olm for the hcp-olm test environment.
package tools

import (
	_ "github.com/operator-framework/operator-lifecycle-manager/cmd/catalog"
	_ "github.com/operator-framework/operator-lifecycle-manager/cmd/copy-content"
	_ "github.com/operator-framework/operator-lifecycle-manager/cmd/olm"
	_ "github.com/operator-framework/operator-lifecycle-manager/cmd/package-server"
	_ "github.com/operator-framework/operator-lifecycle-manager/util/cpb"
)
