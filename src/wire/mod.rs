//! The bottom layer: data formats read the same way by the pure engine and by the client,
//! importing nothing else of podalloc (the layer test, `src/layers.rs`, keeps it so).
//! - [`protobuf`]: the Protobuf wire format as Kubernetes writes it (varints,
//!   length-delimited fields, the `k8s\0` + `runtime.Unknown` envelope).

pub(crate) mod protobuf;
