//! The store conformance suite against [`MemoryStore`].
//!
//! An integration test rather than a unit test: the suite is in
//! idem-testkit, which links this crate as a library, so only a store from
//! that same library satisfies its `Store` bound.

use idem_core::MemoryStore;

idem_testkit::conformance_tests!(async { MemoryStore::new() });
