//! `idem records get | purge`.

use anyhow::{Context, bail};
use idem_core::{Key, Operation, RecordId, Scope, StaleCursor, Timestamp};
use idem_http::PathPattern;

use crate::cli::RecordsCommand;
use crate::config::route_operations;
use crate::stores::StoreUrl;
use crate::units::duration;

/// Parses `--store` (here, not in clap: clap would echo a refused URL,
/// password and all) and opens it.
async fn open(url: &str) -> anyhow::Result<std::sync::Arc<dyn idem_core::Store>> {
    url.parse::<StoreUrl>().context("--store")?.open().await
}

pub(crate) async fn run(cmd: RecordsCommand) -> anyhow::Result<()> {
    match cmd {
        RecordsCommand::Get {
            key,
            store,
            tenant,
            credential,
            method,
            path,
            config,
        } => {
            let key = Key::new(key).context("invalid key")?;
            let scope = match (&tenant[..], credential) {
                ([_, ..], _) => {
                    Scope::from_parts(&tenant.iter().map(|t| t.as_bytes()).collect::<Vec<_>>())
                }
                ([], Some(c)) => Scope::from_credential(c.as_bytes()),
                ([], None) => Scope::anonymous(),
            };
            let operations = match (path, config) {
                (Some(p), _) => vec![(method, p)],
                (None, Some(c)) => route_operations(&c)?,
                (None, None) => Vec::new(),
            };
            let store = open(&store).await?;
            if operations.is_empty() {
                // The key and the scope are enough: the newest record.
                let found = store
                    .find_by_key(&scope, &key, Timestamp::now(), 1)
                    .await
                    .context("reading the record")?;
                let Some(record) = found.first() else {
                    bail!("no live record for that key and scope")
                };
                println!(
                    "{}",
                    serde_json::to_string_pretty(&idem_http::RecordView::from(record))?
                );
                return Ok(());
            }
            for (m, p) in operations {
                let id = RecordId::new(
                    scope.clone(),
                    Operation::new(&m, PathPattern::new(&p).as_str()),
                    key.clone(),
                );
                if let Some(view) = idem_http::lookup(&*store, &id)
                    .await
                    .context("reading the record")?
                {
                    println!("{}", serde_json::to_string_pretty(&view)?);
                    return Ok(());
                }
            }
            bail!("no live record for that key, scope and operation")
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
                .context("--older-than")?
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
