//! operator-registry gRPC API. Generated code lands here (issue 3).
