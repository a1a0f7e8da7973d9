//! A test peer of otel_proofscope: proves Plonky3's Keccak AIR over Goldilocks (the
//! configuration of Plonky3's `prove_goldilocks_keccak` example), verifies the proof, and
//! exports Plonky3's own `tracing` spans to the console (tracing-forest) and/or over OTLP.

use std::collections::HashMap;
use std::ffi::OsString;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::{TraceContextExt, TracerProvider as _};
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::resource::{EnvResourceDetector, ResourceDetector};
use opentelemetry_sdk::trace::{SdkTracerProvider, SpanData, SpanExporter};
use p3_challenger::{HashChallenger, SerializingChallenger64};
use p3_commit::ExtensionMmcs;
use p3_dft::Radix2DitParallel;
use p3_field::extension::BinomialExtensionField;
use p3_fri::{FriParameters, TwoAdicFriPcs};
use p3_goldilocks::Goldilocks;
use p3_keccak::{Keccak256Hash, KeccakF};
use p3_keccak_air::{KeccakAir, NUM_ROUNDS, generate_trace_rows};
use p3_merkle_tree::MerkleTreeMmcs;
use p3_symmetric::{CompressionFunctionFromHasher, PaddingFreeSponge, SerializingHasher};
use p3_uni_stark::{StarkConfig, prove, verify};
use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};
use tracing::info_span;
use tracing_forest::ForestLayer;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Registry};

const NAME: &str = "plonky3-prover";
const DEFAULT_LOG_ROWS: u32 = 12;
// Fewer rows than 2^5 cannot hold one Keccak permutation (24 rows) at an exact power of two.
const MIN_LOG_ROWS: u32 = 5;
// The LDE and quotient domains (2^(N+1)) must fit Goldilocks' 2^32 subgroups; one bit spare.
const MAX_LOG_ROWS: u32 = 30;

const HELP: &str = "\
plonky3-prover: prove and verify Plonky3's Keccak AIR over Goldilocks (the configuration of
Plonky3's prove_goldilocks_keccak example: Keccak Merkle MMCS, TwoAdicFriPcs, FRI benchmark
parameters), printing or exporting Plonky3's tracing spans.

usage: plonky3-prover [--log-rows N] [--forest]

options:
  --log-rows N   trace height 2^N rows, N from 5 to 30 (default 12). The trace holds
                 floor(2^N / 24) Keccak-f permutations (24 rows each, at least 1), padded to
                 2^N rows. Peak memory is about 42 KB x 2^N (11 GB at N = 18).
  --forest       with an OTLP endpoint set, print the tracing-forest console tree as well
  -h, --help     print this help

Spans are filtered by RUST_LOG (default: info). The whole run is one trace, rooted at an
INFO span named plonky3-prover (fields log_rows, hashes) around trace generation, prove
and verify.

Without OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT the spans are
printed as a tracing-forest tree on stdout (with ANSI colours). With one of them set they
are exported over OTLP instead (and printed too with --forest):
  OTEL_EXPORTER_OTLP_TRACES_PROTOCOL, else OTEL_EXPORTER_OTLP_PROTOCOL:
                 grpc or http/protobuf (default http/protobuf, as the OTel spec and the
                 opentelemetry-otlp crate default)
  OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES: the resource; service.name defaults to
                 plonky3-prover when neither sets it
  OTEL_EXPORTER_OTLP_HEADERS, ..._TIMEOUT, OTEL_BSP_*: as opentelemetry-otlp reads them
  TRACEPARENT (and TRACESTATE): a W3C parent for the root span, 00-<32 hex>-<16 hex>-<2 hex>;
                 its sampled flag (01) must be set, or nothing is exported
Plain HTTP and gRPC only (no TLS).

exit status: 0 proved and verified (and every span delivered), 1 a proof, verification or
export failure, 2 a bad argument or setting.
";

/// A failure and the exit status it maps to.
enum Failure {
    Usage(String),
    Run(String),
}

struct Args {
    log_rows: u32,
    forest: bool,
}

fn parse_args(mut args: impl Iterator<Item = OsString>) -> Result<Option<Args>, String> {
    let mut parsed = Args {
        log_rows: DEFAULT_LOG_ROWS,
        forest: false,
    };
    while let Some(arg) = args.next() {
        let arg = arg
            .into_string()
            .map_err(|a| format!("argument {a:?} is not UTF-8"))?;
        let value = match arg.as_str() {
            "-h" | "--help" => return Ok(None),
            "--forest" => {
                parsed.forest = true;
                continue;
            }
            "--log-rows" => args
                .next()
                .ok_or("--log-rows needs a value")?
                .into_string()
                .map_err(|a| format!("--log-rows value {a:?} is not UTF-8"))?,
            _ => match arg.strip_prefix("--log-rows=") {
                Some(value) => value.to_owned(),
                None => return Err(format!("unknown argument '{arg}' (see --help)")),
            },
        };
        parsed.log_rows = value
            .parse()
            .ok()
            .filter(|n| (MIN_LOG_ROWS..=MAX_LOG_ROWS).contains(n))
            .ok_or_else(|| {
                format!("--log-rows: expected an integer from {MIN_LOG_ROWS} to {MAX_LOG_ROWS}, got '{value}'")
            })?;
    }
    Ok(Some(parsed))
}

/// A variable's value, with an empty value read as unset (as the OTel spec says).
fn env_var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

#[derive(Clone, Copy)]
enum Protocol {
    Grpc,
    HttpProtobuf,
}

impl Protocol {
    /// The name OTEL_EXPORTER_OTLP_PROTOCOL gives it.
    const fn name(self) -> &'static str {
        match self {
            Self::Grpc => "grpc",
            Self::HttpProtobuf => "http/protobuf",
        }
    }
}

fn otlp_protocol() -> Result<Protocol, String> {
    for var in [
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
        "OTEL_EXPORTER_OTLP_PROTOCOL",
    ] {
        if let Some(value) = env_var(var) {
            return [Protocol::Grpc, Protocol::HttpProtobuf]
                .into_iter()
                .find(|p| p.name() == value)
                .ok_or_else(|| {
                    format!("{var}: expected 'grpc' or 'http/protobuf', got '{value}'")
                });
        }
    }
    Ok(Protocol::HttpProtobuf)
}

/// The first export failure, kept because the batch processor logs and drops them.
#[derive(Debug, Default)]
struct ExportFailures(Mutex<Option<(usize, String)>>);

#[derive(Debug)]
struct CheckedExporter {
    inner: opentelemetry_otlp::SpanExporter,
    failures: Arc<ExportFailures>,
}

impl SpanExporter for CheckedExporter {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let spans = batch.len();
        let result = self.inner.export(batch).await;
        if let Err(err) = &result {
            let mut failures = self.failures.0.lock().unwrap_or_else(|e| e.into_inner());
            let (lost, _) = failures.get_or_insert_with(|| (0, err.to_string()));
            *lost += spans;
        }
        result
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

/// The OTLP pipeline, kept until every span is delivered.
struct Otlp {
    provider: SdkTracerProvider,
    failures: Arc<ExportFailures>,
    // tonic's channel runs its connection on this runtime; the batch processor's own thread
    // drives exports, so HTTP (reqwest's blocking client) needs no runtime at all.
    _runtime: Option<tokio::runtime::Runtime>,
}

impl Otlp {
    fn new(protocol: Protocol) -> Result<Self, Failure> {
        let build_error = |e: opentelemetry_otlp::ExporterBuildError| {
            Failure::Usage(format!(
                "cannot build the OTLP {} exporter: {e}",
                protocol.name()
            ))
        };
        let (inner, runtime) = match protocol {
            Protocol::Grpc => {
                let runtime = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(1)
                    .enable_all()
                    .build()
                    .map_err(|e| Failure::Run(format!("cannot start the Tokio runtime: {e}")))?;
                // connect_lazy spawns the channel's worker onto the current runtime.
                let _entered = runtime.enter();
                let exporter = opentelemetry_otlp::SpanExporter::builder()
                    .with_tonic()
                    .build()
                    .map_err(build_error)?;
                (exporter, Some(runtime))
            }
            Protocol::HttpProtobuf => {
                let exporter = opentelemetry_otlp::SpanExporter::builder()
                    .with_http()
                    .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
                    .build()
                    .map_err(build_error)?;
                (exporter, None)
            }
        };

        let failures = Arc::new(ExportFailures::default());
        let exporter = CheckedExporter {
            inner,
            failures: Arc::clone(&failures),
        };
        let mut resource = Resource::builder();
        let service_name_key = opentelemetry::Key::from_static_str("service.name");
        if env_var("OTEL_SERVICE_NAME").is_none()
            && EnvResourceDetector::new()
                .detect()
                .get(&service_name_key)
                .is_none()
        {
            resource = resource.with_service_name(NAME);
        }
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(resource.build())
            .build();
        Ok(Self {
            provider,
            failures,
            _runtime: runtime,
        })
    }

    /// Flushes and stops the exporter; an error if any span was not delivered.
    fn shutdown(self) -> Result<(), Failure> {
        self.provider
            .shutdown()
            .map_err(|e| Failure::Run(format!("OTLP shutdown failed: {e}")))?;
        let failures = self.failures.0.lock().unwrap_or_else(|e| e.into_inner());
        match &*failures {
            Some((lost, err)) => Err(Failure::Run(format!(
                "OTLP export failed, {lost} spans lost: {err}"
            ))),
            None => Ok(()),
        }
    }
}

/// The remote parent from TRACEPARENT, or None for a new trace (with a warning if malformed).
fn remote_parent() -> Option<opentelemetry::Context> {
    let traceparent = match std::env::var("TRACEPARENT") {
        Ok(v) if v.is_empty() => return None,
        Ok(v) => v,
        Err(std::env::VarError::NotPresent) => return None,
        Err(std::env::VarError::NotUnicode(_)) => String::new(),
    };
    // The propagator accepts short ids and later versions, so check the exact shape first.
    let parts: Vec<&str> = traceparent.split('-').collect();
    let well_formed = parts.len() == 4
        && parts[0] == "00"
        && parts.iter().zip([2, 32, 16, 2]).all(|(part, len)| {
            part.len() == len && part.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
        });
    let mut carrier = HashMap::from([("traceparent".to_owned(), traceparent.clone())]);
    if let Some(tracestate) = env_var("TRACESTATE") {
        carrier.insert("tracestate".to_owned(), tracestate);
    }
    let cx = TraceContextPropagator::new().extract(&carrier);
    if well_formed && cx.span().span_context().is_valid() {
        Some(cx)
    } else {
        eprintln!(
            "{NAME}: warning: ignoring malformed TRACEPARENT {traceparent:?}, starting a new trace"
        );
        None
    }
}

/// Plonky3's prove_goldilocks_keccak example, with the number of hashes as a parameter.
fn prove_and_verify(num_hashes: usize) -> Result<(), Failure> {
    type Val = Goldilocks;
    type Challenge = BinomialExtensionField<Val, 2>;

    type ByteHash = Keccak256Hash;
    type U64Hash = PaddingFreeSponge<KeccakF, 25, 17, 4>;
    type FieldHash = SerializingHasher<U64Hash>;
    let byte_hash = ByteHash {};
    let u64_hash = U64Hash::new(KeccakF {});
    let field_hash = FieldHash::new(u64_hash);

    type MyCompress = CompressionFunctionFromHasher<U64Hash, 2, 4>;
    let compress = MyCompress::new(u64_hash);

    type ValMmcs = MerkleTreeMmcs<
        [Val; p3_keccak::VECTOR_LEN],
        [u64; p3_keccak::VECTOR_LEN],
        FieldHash,
        MyCompress,
        2,
        4,
    >;
    let val_mmcs = ValMmcs::new(field_hash, compress, 3);

    type ChallengeMmcs = ExtensionMmcs<Val, Challenge, ValMmcs>;
    let challenge_mmcs = ChallengeMmcs::new(val_mmcs.clone());

    type Dft = Radix2DitParallel<Val>;
    let dft = Dft::default();

    type Challenger = SerializingChallenger64<Val, HashChallenger<u8, ByteHash, 32>>;
    let challenger = Challenger::from_hasher(vec![], byte_hash);

    let fri_params = FriParameters::new_benchmark(challenge_mmcs);

    let mut rng = SmallRng::seed_from_u64(1);
    let inputs = (0..num_hashes).map(|_| rng.random()).collect::<Vec<_>>();
    let trace = generate_trace_rows::<Val>(inputs, fri_params.log_blowup);

    type Pcs = TwoAdicFriPcs<Val, Dft, ValMmcs, ChallengeMmcs>;
    let pcs = Pcs::new(dft, val_mmcs, fri_params);

    type MyConfig = StarkConfig<Pcs, Challenge, Challenger>;
    let config = MyConfig::new(pcs, challenger);

    let proof = prove(&config, &KeccakAir {}, trace, &[])
        .map_err(|e| Failure::Run(format!("proving failed: {e}")))?;
    verify(&config, &KeccakAir {}, &proof, &[])
        .map_err(|e| Failure::Run(format!("verification failed: {e}")))
}

fn run() -> Result<(), Failure> {
    let Some(args) = parse_args(std::env::args_os().skip(1)).map_err(Failure::Usage)? else {
        print!("{HELP}");
        return Ok(());
    };
    let otlp_on = env_var("OTEL_EXPORTER_OTLP_ENDPOINT").is_some()
        || env_var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").is_some();
    let otlp = if otlp_on {
        Some(Otlp::new(otlp_protocol().map_err(Failure::Usage)?)?)
    } else {
        None
    };

    let env_filter = EnvFilter::builder()
        .with_default_directive(LevelFilter::INFO.into())
        .from_env_lossy();
    let forest = (otlp.is_none() || args.forest).then(ForestLayer::default);
    let otel_layer = otlp
        .as_ref()
        .map(|o| tracing_opentelemetry::layer().with_tracer(o.provider.tracer(NAME)));
    // One global filter in front of both layers, so the console and OTLP see the same spans.
    Registry::default()
        .with(env_filter)
        .with(forest)
        .with(otel_layer)
        .init();

    let num_hashes = ((1usize << args.log_rows) / NUM_ROUNDS).max(1);
    // As i64: tracing-opentelemetry exports unsigned fields as strings.
    let root = info_span!(
        "plonky3-prover",
        log_rows = i64::from(args.log_rows),
        hashes = num_hashes as i64
    );
    if otlp.is_some()
        && let Some(parent) = remote_parent()
    {
        // Must happen before the span is first entered, which starts its OTel span.
        root.set_parent(parent)
            .map_err(|e| Failure::Run(format!("cannot set the TRACEPARENT parent: {e}")))?;
    }
    let proved = root.in_scope(|| prove_and_verify(num_hashes));
    // Closing the root prints the forest tree and ends the OTel root span.
    drop(root);

    // Deliver the spans even when the proof failed: they show where it failed.
    let delivered = otlp.map_or(Ok(()), Otlp::shutdown);
    if let (Err(_), Err(Failure::Run(msg) | Failure::Usage(msg))) = (&proved, &delivered) {
        eprintln!("{NAME}: {msg}");
    }
    proved.and(delivered)
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::Usage(msg)) => {
            eprintln!("{NAME}: {msg}");
            ExitCode::from(2)
        }
        Err(Failure::Run(msg)) => {
            eprintln!("{NAME}: {msg}");
            ExitCode::FAILURE
        }
    }
}
