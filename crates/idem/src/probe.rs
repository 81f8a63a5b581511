//! `idem probe`: maps the flags onto idem-probe's target, detection and
//! options (every refusal a usage error, exit 2), runs the probe, and
//! prints the report on stdout. Exit 0 when every required check passed,
//! 1 otherwise.

use std::io::IsTerminal;
use std::process::ExitCode;

use anyhow::Context;
use idem_probe::{
    Detection, Options, Probe, Target, parse_body, parse_credential, parse_header, parse_pointer,
    parse_query, parse_url,
};

use crate::cli::{ProbeArgs, ProbeFormat};
use crate::exit::{Exit, OrUsage};

/// The validated settings.
struct Settings {
    target: Target,
    detection: Detection,
    options: Options,
}

impl Settings {
    fn from_args(args: &ProbeArgs) -> anyhow::Result<Settings> {
        let url = parse_url(&args.url).context("--url").or_usage()?;
        let body = parse_body(&args.body).context("--body").or_usage()?;
        let mut target = Target::new(url, body);
        target.method = http::Method::from_bytes(args.method.to_ascii_uppercase().as_bytes())
            .with_context(|| format!("--method {:?} is not an HTTP method", args.method))
            .or_usage()?;
        for h in &args.headers {
            target
                .headers
                .push(parse_header(h).context("--header").or_usage()?);
        }
        target.credential = args
            .credential
            .as_deref()
            .map(|c| parse_credential(c).context("--credential"))
            .transpose()
            .or_usage()?;
        target.second_credential = args
            .second_credential
            .as_deref()
            .map(|c| parse_credential(c).context("--second-credential"))
            .transpose()
            .or_usage()?;
        target.failing_body = args
            .failing_body
            .as_deref()
            .map(|b| parse_body(b).context("--failing-body"))
            .transpose()
            .or_usage()?;
        target.transient_body = args
            .transient_body
            .as_deref()
            .map(|b| parse_body(b).context("--transient-body"))
            .transpose()
            .or_usage()?;
        target.other_url = args
            .other_url
            .as_deref()
            .map(|u| parse_url(u).context("--other-url"))
            .transpose()
            .or_usage()?;
        target.other_body = args
            .other_body
            .as_deref()
            .map(|b| parse_body(b).context("--other-body"))
            .transpose()
            .or_usage()?;
        target.other_query = args
            .other_query
            .as_deref()
            .map(|q| parse_query(q).context("--other-query"))
            .transpose()
            .or_usage()?;
        target.key_header = parse_header(&format!("{}: x", args.key_header))
            .context("--key-header")
            .or_usage()?
            .name;
        let detection = Detection {
            id_pointer: args
                .id_pointer
                .as_deref()
                .map(|p| parse_pointer(p).context("--id-pointer"))
                .transpose()
                .or_usage()?,
            effect_url: args
                .effect_url
                .as_deref()
                .map(|u| parse_url(u).context("--effect-url"))
                .transpose()
                .or_usage()?,
            effect_pointer: parse_pointer(&args.effect_pointer)
                .context("--effect-pointer")
                .or_usage()?,
        };
        let options = Options {
            max_requests: args.max_requests,
            concurrency: args.concurrency,
            pause: crate::units::duration(&args.pause)
                .context("--pause")
                .or_usage()?,
            timeout: crate::units::duration(&args.timeout)
                .context("--timeout")
                .or_usage()?,
            skip: args.skip.clone(),
            ca_pem: args
                .ca_cert
                .as_deref()
                .map(|p| {
                    std::fs::read(p)
                        .with_context(|| format!("--ca-cert: cannot read {}", p.display()))
                })
                .transpose()
                .or_usage()?,
        };
        Ok(Settings {
            target,
            detection,
            options,
        })
    }
}

/// Runs `idem probe`.
pub(crate) async fn run(args: &ProbeArgs) -> anyhow::Result<ExitCode> {
    let settings = Settings::from_args(args)?;
    let probe = match Probe::new(settings.target, settings.detection, settings.options) {
        Ok(p) => p,
        Err(e) if e.is_usage() => return Err(e).or_usage(),
        Err(e) => return Err(e.into()),
    };
    let report = probe.run().await;
    let text = match args.format {
        ProbeFormat::Text => report.to_text(std::io::stdout().is_terminal()),
        ProbeFormat::Json => report.to_json() + "\n",
        ProbeFormat::Junit => report.to_junit(),
    };
    // A closed pipe (`idem probe ... | head`) is not an error of the probe.
    {
        use std::io::Write;
        let mut out = std::io::stdout().lock();
        if let Err(e) = out.write_all(text.as_bytes()).and_then(|()| out.flush())
            && e.kind() != std::io::ErrorKind::BrokenPipe
        {
            return Err(e).context("writing the report");
        }
    }
    Ok(if report.passed() {
        Exit::Success
    } else {
        Exit::Runtime
    }
    .into())
}
