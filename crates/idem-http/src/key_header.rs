//! The `Idempotency-Key` header's name, the one thing the layer, the
//! request flow and the rejections all name.

use http::HeaderName;

/// The `Idempotency-Key` header.
pub const IDEMPOTENCY_KEY: HeaderName =
    HeaderName::from_static(idem_core::header_names::IDEMPOTENCY_KEY);
