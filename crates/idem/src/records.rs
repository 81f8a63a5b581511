//! `idem records get | release | stale | purge`.
//!
//! `records get` and `records release` need the caller's scope: `--tenant`, or the credential
//! from `IDEM_CREDENTIAL` or `--credential-stdin`. Never from the
//! arguments, which other users see (`ps`) and shells keep in history:
//! `--credential VALUE` is refused, not used.

use std::io::BufRead;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, anyhow, bail};
use idem_core::{
    Key, Operation, Record, RecordId, Scope, Settled, StaleCursor, Status, Store, Timestamp,
};
use idem_http::PathPattern;

use crate::cli::{RecordTarget, RecordsCommand, StoreArgs};
use crate::config::route_operations;
use crate::exit::{NotFound, OrUsage};
use crate::tls::CaFile;
use crate::units::duration;
use idem_stores::StoreUrl;

/// The environment variable holding the credential for `records get`.
const CREDENTIAL_ENV: &str = "IDEM_CREDENTIAL";

/// Parses `--store` (here, not in clap: clap would echo a refused URL,
/// password and all) and opens it.
///
/// An SQLite store must exist: opening would create an empty one, and a
/// mistyped path would then read as "no such record" (exit 3) or purge
/// nothing.
async fn open(args: &StoreArgs) -> anyhow::Result<std::sync::Arc<dyn idem_core::Store>> {
    let store = args
        .store
        .parse::<StoreUrl>()
        .context("--store")
        .or_usage()?;
    if let StoreUrl::Sqlite(path) = &store
        && !path.exists()
    {
        return Err(anyhow!("--store: no SQLite store at {}", path.display())).or_usage();
    }
    let ca = match &args.store_ca {
        Some(path) => Some(CaFile::read(path).context("--store-ca").or_usage()?),
        None => None,
    };
    Ok(store.open(ca.as_ref().map(CaFile::pem)).await?)
}

/// Where `records get` takes the caller's scope from.
#[derive(Debug)]
enum ScopeInput {
    Tenant(Vec<String>),
    Credential(String),
    Anonymous,
}

/// The scope, from exactly one of `--tenant`, `--credential-stdin` and
/// `IDEM_CREDENTIAL` (more than one is refused: they could name different
/// callers). A set but empty `IDEM_CREDENTIAL` is refused: it is what
/// `IDEM_CREDENTIAL="$TOKEN"` gives when `TOKEN` is unset, and reading the
/// anonymous scope instead would answer "not found" for a record that
/// exists.
fn scope_input(
    tenant: Vec<String>,
    credential_stdin: bool,
    credential_argv: Option<Option<String>>,
) -> anyhow::Result<ScopeInput> {
    if credential_argv.is_some() {
        bail!(
            "--credential is refused: a credential in the arguments is visible to other users and kept in shell history; set {CREDENTIAL_ENV} or pipe it to --credential-stdin"
        );
    }
    let from_env = match std::env::var(CREDENTIAL_ENV) {
        Ok(v) if v.is_empty() => {
            bail!("{CREDENTIAL_ENV} is set but empty; unset it to read the anonymous scope")
        }
        Ok(v) => Some(v),
        Err(std::env::VarError::NotPresent) => None,
        Err(std::env::VarError::NotUnicode(_)) => bail!("{CREDENTIAL_ENV} is not valid UTF-8"),
    };
    let given = usize::from(!tenant.is_empty())
        + usize::from(credential_stdin)
        + usize::from(from_env.is_some());
    if given > 1 {
        bail!(
            "give the scope one way: --tenant, --credential-stdin or {CREDENTIAL_ENV} (set: {})",
            [
                (!tenant.is_empty()).then_some("--tenant"),
                credential_stdin.then_some("--credential-stdin"),
                from_env.is_some().then_some(CREDENTIAL_ENV),
            ]
            .into_iter()
            .flatten()
            .collect::<Vec<_>>()
            .join(", ")
        );
    }
    if !tenant.is_empty() {
        return Ok(ScopeInput::Tenant(tenant));
    }
    if credential_stdin {
        return read_credential(std::io::stdin().lock()).map(ScopeInput::Credential);
    }
    Ok(from_env.map_or(ScopeInput::Anonymous, ScopeInput::Credential))
}

/// One line from `input`, without its line ending; refused when empty.
fn read_credential(mut input: impl BufRead) -> anyhow::Result<String> {
    let mut line = String::new();
    input
        .read_line(&mut line)
        .context("--credential-stdin: cannot read standard input")?;
    let credential = line
        .strip_suffix('\n')
        .map(|l| l.strip_suffix('\r').unwrap_or(l))
        .unwrap_or(&line);
    if credential.is_empty() {
        bail!("--credential-stdin: standard input held no credential (an empty line)");
    }
    Ok(credential.to_owned())
}

/// The live record `target` names, and the store it was read from: the
/// newest with the key in the scope, or the first of the operations named
/// (`--path`, or the routes of `--config`) that has one.
async fn find(target: RecordTarget) -> anyhow::Result<(Arc<dyn Store>, Record)> {
    let RecordTarget {
        key,
        store,
        tenant,
        credential_stdin,
        credential,
        method,
        path,
        config,
    } = target;
    // First: a credential typed on the command line is refused before
    // anything else is read.
    let scope = match scope_input(tenant, credential_stdin, credential).or_usage()? {
        ScopeInput::Tenant(tenant) => {
            Scope::from_parts(&tenant.iter().map(|t| t.as_bytes()).collect::<Vec<_>>())
        }
        ScopeInput::Credential(c) => Scope::from_credential(c.as_bytes()),
        ScopeInput::Anonymous => Scope::anonymous(),
    };
    // As the key header is read: bare or as an sf-string.
    let key = Key::from_header_value(key.as_bytes())
        .context("invalid key")
        .or_usage()?;
    let operations = match (path, config) {
        // Upper-cased, as the read path's `?method=` is: an operator's
        // `post` means the POST a client sent (records name methods as
        // sent since methods are case-sensitive, and the gateway refuses a
        // lower-case standard one).
        (Some(p), _) => vec![(method.to_ascii_uppercase(), p)],
        (None, Some(c)) => route_operations(&c).or_usage()?,
        (None, None) => Vec::new(),
    };
    let store = open(&store).await?;
    let now = Timestamp::now();
    if operations.is_empty() {
        // The key and the scope are enough: the newest record.
        let found = store
            .find_by_key(&scope, &key, now, 1)
            .await
            .context("reading the record")?;
        return match found.into_iter().next() {
            Some(record) => Ok((store, record)),
            None => Err(anyhow!(NotFound("no live record for that key and scope"))),
        };
    }
    for (m, p) in operations {
        let id = RecordId::new(
            scope.clone(),
            Operation::new(&m, PathPattern::new(&p).as_str()),
            key.clone(),
        );
        if let Some(record) = store.get(&id, now).await.context("reading the record")? {
            return Ok((store, record));
        }
    }
    Err(anyhow!(NotFound(
        "no live record for that key, scope and operation"
    )))
}

pub(crate) async fn run(cmd: RecordsCommand) -> anyhow::Result<()> {
    match cmd {
        RecordsCommand::Get(target) => {
            let (_, record) = find(target).await?;
            println!(
                "{}",
                serde_json::to_string_pretty(&idem_http::RecordView::from(&record))?
            );
            Ok(())
        }
        RecordsCommand::Release { target, force } => {
            let (store, record) = find(target).await?;
            let now = Timestamp::now();
            if record.status != Status::InProgress {
                return Err(anyhow!(
                    "the record is {}: its outcome is known and stays until it expires",
                    record.status.as_str()
                ))
                .or_usage();
            }
            if record.lease_is_live(now) && !force {
                return Err(anyhow!(
                    "its lease is live for {:?} more: an execution may still be running (or a retry of a held key took it over again); release it once the lease is over, or with --force once you know nothing runs",
                    record.lease_until.map_or(Duration::ZERO, |l| l.saturating_since(now))
                ))
                .or_usage();
            }
            match store
                .release(&record.id, record.fence, now)
                .await
                .context("releasing the record")?
            {
                Settled::Applied => {
                    println!(
                        "released {} (fence {}): the next request with this key executes it",
                        record.id.operation.as_str(),
                        record.fence.get()
                    );
                    Ok(())
                }
                Settled::StaleFence => Err(anyhow!(
                    "the record changed meanwhile (finished, or taken over by a request): nothing was released; read it again"
                )),
            }
        }
        RecordsCommand::Stale { store, limit } => {
            let store = open(&store).await?;
            let now = Timestamp::now();
            let mut cursor: Option<StaleCursor> = None;
            let mut shown = 0;
            println!(
                "{:<24} {:<12} {:<28} {:>10}  key (log id)",
                "lease ended", "overdue", "operation", "fence"
            );
            while shown < limit {
                let page = store
                    .list_stale(now, cursor.as_ref(), (limit - shown).min(100))
                    .await
                    .context("listing stale records")?;
                let Some(last) = page.last() else { break };
                cursor = Some(StaleCursor::after(last));
                for r in &page {
                    let lease = r.lease_until.unwrap_or_default();
                    println!(
                        "{:<24} {:<12} {:<28} {:>10}  {}",
                        idem_http::http_date(lease).unwrap_or_else(|| "(out of range)".into()),
                        format!("{}s", now.saturating_since(lease).as_secs()),
                        r.id.operation.as_str(),
                        r.fence.get(),
                        r.id.key.log_id()
                    );
                }
                shown += page.len();
            }
            println!("{shown} stale records");
            Ok(())
        }
        RecordsCommand::Purge { store, older_than } => {
            let age = older_than
                .map(|d| duration(&d))
                .transpose()
                .context("--older-than")
                .or_usage()?
                .unwrap_or_default();
            let store = open(&store).await?;
            let cutoff = Timestamp::now() - age;
            let total = idem_http::maintenance::purge_expired(
                &*store,
                cutoff,
                idem_http::maintenance::PURGE_BATCH,
                std::time::Duration::from_secs(60),
            )
            .await
            .context("purging")?;
            println!("purged {total} expired records");
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_credential_is_one_line_of_standard_input() {
        let read = |input: &str| read_credential(input.as_bytes());
        assert_eq!(read("Bearer abc\n").unwrap(), "Bearer abc");
        assert_eq!(read("Bearer abc\r\nmore\n").unwrap(), "Bearer abc");
        assert_eq!(read("Bearer abc").unwrap(), "Bearer abc");
        assert_eq!(
            read(" padded \n").unwrap(),
            " padded ",
            "only the line ending goes"
        );
        assert!(read("").is_err());
        assert!(read("\n").is_err());
    }

    #[test]
    fn a_credential_in_the_arguments_is_refused_unread() {
        for argv in [Some("Bearer s3cret".to_owned()), None] {
            let e = scope_input(Vec::new(), false, Some(argv)).unwrap_err();
            let text = format!("{e:#}");
            assert!(
                text.contains(CREDENTIAL_ENV) && text.contains("--credential-stdin"),
                "{text}"
            );
            assert!(!text.contains("s3cret"), "{text}");
        }
    }
}
