//! The store's epoch (`idem_core::EpochWatch`): where it lives. One place
//! on one server (`store`, at `PREFIX:epoch`); on a cluster one place per
//! master, named by the slots it serves (`slots 0-5460`), at a key whose
//! hash tag lies in those slots. A name by slots, not by node, stays the
//! same when a replica is promoted for them: a failover to a replica that
//! was behind is then the same place with a lower counter, a rollback.

/// How many slots a Redis Cluster has.
const SLOTS: u16 = 16384;

/// How many tags [`shard_tag`] tries before it gives up. A master serving
/// a single slot is hit by one tag in 16,384 on average: missing it this
/// many times in a row has a probability of about e^-256.
const TAG_TRIES: u32 = 1 << 22;

/// CRC16-XMODEM (polynomial 0x1021, initial value 0), as Redis Cluster
/// hashes keys.
fn crc16(bytes: &[u8]) -> u16 {
    bytes.iter().fold(0u16, |crc, b| {
        let mut crc = crc ^ (u16::from(*b) << 8);
        for _ in 0..8 {
            crc = if crc & 0x8000 == 0 {
                crc << 1
            } else {
                (crc << 1) ^ 0x1021
            };
        }
        crc
    })
}

/// The slot of `key`, as Redis Cluster computes it: of its hash tag (the
/// bytes between the first `{` and the first `}` after it) if that is not
/// empty, else of the whole key.
pub(crate) fn key_slot(key: &[u8]) -> u16 {
    let tagged = key.iter().position(|b| *b == b'{').and_then(|open| {
        let rest = key.get(open + 1..)?;
        let close = rest.iter().position(|b| *b == b'}')?;
        rest.get(..close).filter(|tag| !tag.is_empty())
    });
    crc16(tagged.unwrap_or(key)) % SLOTS
}

/// The first hash tag `eN` (N = 0, 1, ...) whose slot lies in `ranges`
/// (inclusive), or `None` when none does within [`TAG_TRIES`] (no slot in
/// `ranges`).
pub(crate) fn shard_tag(ranges: &[(u16, u16)]) -> Option<String> {
    if ranges.iter().all(|(start, end)| start > end) {
        return None;
    }
    (0..TAG_TRIES).map(|n| format!("e{n}")).find(|tag| {
        let slot = key_slot(tag.as_bytes());
        ranges
            .iter()
            .any(|(start, end)| *start <= slot && slot <= *end)
    })
}

/// The place of a master serving `ranges`: `slots 0-5460`, or with more
/// than one range `slots 0-99,5000-5460`, in slot order.
pub(crate) fn shard_place(ranges: &[(u16, u16)]) -> String {
    let mut sorted = ranges.to_vec();
    sorted.sort_unstable();
    let named: Vec<String> = sorted
        .iter()
        .map(|(start, end)| format!("{start}-{end}"))
        .collect();
    format!("slots {}", named.join(","))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_redis_clusters() {
        // From the Redis Cluster specification and `CLUSTER KEYSLOT`.
        assert_eq!(crc16(b"123456789"), 0x31C3);
        assert_eq!(key_slot(b"123456789"), 12739);
        assert_eq!(key_slot(b"foo"), 12182);
        assert_eq!(key_slot(b"bar"), 5061);
        assert_eq!(key_slot(b"{user1000}.following"), key_slot(b"user1000"));
        assert_eq!(key_slot(b"foo{}{bar}"), crc16(b"foo{}{bar}") % SLOTS);
        assert_eq!(key_slot(b"foo{{bar}}zap"), key_slot(b"{bar"));
        assert_eq!(key_slot(b"foo{bar}{zap}"), key_slot(b"bar"));
        assert_eq!(key_slot(b""), 0);
    }

    #[test]
    fn a_tag_lies_in_the_ranges_and_is_the_same_every_time() {
        for ranges in [
            vec![(0, 5460)],
            vec![(5461, 10922)],
            vec![(10923, 16383)],
            vec![(7, 7)],
            vec![(16383, 16383), (0, 0)],
        ] {
            let tag = shard_tag(&ranges).unwrap();
            let slot = key_slot(format!("idem:{{{tag}}}:epoch").as_bytes());
            assert!(
                ranges.iter().any(|(a, b)| *a <= slot && slot <= *b),
                "{tag} has slot {slot}, not in {ranges:?}"
            );
            assert_eq!(shard_tag(&ranges).unwrap(), tag);
        }
        assert_eq!(shard_tag(&[]), None);
        assert_eq!(shard_tag(&[(9, 3)]), None);
    }

    #[test]
    fn places_are_named_by_their_slots_in_order() {
        assert_eq!(shard_place(&[(0, 5460)]), "slots 0-5460");
        assert_eq!(
            shard_place(&[(5000, 5460), (0, 99)]),
            "slots 0-99,5000-5460"
        );
    }
}
