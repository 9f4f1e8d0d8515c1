//! The integration tests, in one binary so that it links once: the real podalloc binary
//! against the simulated API server, the deploy recipes, recorded fixtures, the fuzzed
//! parsers and the conformance corpus. `util` is their shared harness.

mod util;

mod both;
mod real;

mod apiserver;
mod cmstore;
mod conformance;
mod crash;
mod deploy;
mod differential;
mod e2e;
mod endpoints;
mod es_store;
mod events;
mod executorset;
mod failures;
mod faults;
mod fixtures;
mod fuzz;
mod holder;
mod home;
mod hostile;
#[cfg(unix)]
mod kube_auth;
mod leader;
mod lifecycle;
mod mtls;
mod multi;
mod ops;
mod overlap;
#[cfg(unix)]
mod process_kubelet;
mod protobuf;
mod quiet;
mod real_clusters;
mod real_pods;
mod reliability;
mod sim_watch;
mod steer;
mod steer_apps;
mod steering;
