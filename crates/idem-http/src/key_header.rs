//! The `Idempotency-Key` header's name, the one thing the layer, the
//! request flow and the rejections all name; and `Idem-Takeover`, which
//! the layer alone sets on a request it runs.

use http::HeaderName;

/// The `Idempotency-Key` header.
pub const IDEMPOTENCY_KEY: HeaderName =
    HeaderName::from_static(idem_core::header_names::IDEMPOTENCY_KEY);

/// The `Idem-Takeover` header: set by the layer (and only by it) on a
/// request that takes over an earlier execution of its key under the
/// `announce` takeover policy; its value is the key.
pub const IDEM_TAKEOVER: HeaderName =
    HeaderName::from_static(idem_core::header_names::IDEM_TAKEOVER);
