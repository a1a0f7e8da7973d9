//! Proves knowledge of `x_0` such that iterating `x_{i+1} = x_i^2 + c` for
//! `N` steps ends at a public value, with arkworks Groth16 over BN254.
//! ark-std's `print-trace` timers go to stdout as one tree; everything
//! else (summary, errors) goes to stderr so stdout stays parseable.

use std::process::ExitCode;

use ark_bn254::{Bn254, Fr};
use ark_groth16::{prepare_verifying_key, Groth16};
use ark_relations::{
    lc,
    r1cs::{ConstraintSynthesizer, ConstraintSystemRef, SynthesisError, Variable},
};
use ark_std::{
    end_timer,
    rand::{rngs::StdRng, SeedableRng},
    start_timer, UniformRand,
};

const DEFAULT_CONSTRAINTS: usize = 1024;
const USAGE: &str = "\
Usage: arkworks-prover [--constraints N]

Runs Groth16 setup, prove and verify (BN254) on a chain of N squarings
x_{i+1} = x_i^2 + c, one R1CS constraint each, with the final value public.
Timers (ark-std print-trace) are printed to stdout.

Options:
  --constraints N  circuit size, at least 1 (default 1024)
  -h, --help       print this help";

/// `x_{i+1} = x_i^2 + c`, one constraint per step; `x_0` is `None` during setup.
#[derive(Clone)]
struct SquareChain {
    x0: Option<Fr>,
    c: Fr,
    steps: usize,
}

/// The native chain `x_0 ..= x_steps`.
fn chain(x0: Fr, c: Fr, steps: usize) -> Vec<Fr> {
    let mut xs = Vec::with_capacity(steps + 1);
    xs.push(x0);
    for i in 0..steps {
        xs.push(xs[i] * xs[i] + c);
    }
    xs
}

impl ConstraintSynthesizer<Fr> for SquareChain {
    fn generate_constraints(self, cs: ConstraintSystemRef<Fr>) -> Result<(), SynthesisError> {
        let xs = self.x0.map(|x0| chain(x0, self.c, self.steps));
        let value = |i: usize| {
            xs.as_ref()
                .map(|xs| xs[i])
                .ok_or(SynthesisError::AssignmentMissing)
        };

        let mut x = cs.new_witness_variable(|| value(0))?;
        for i in 1..=self.steps {
            let next = if i == self.steps {
                cs.new_input_variable(|| value(i))?
            } else {
                cs.new_witness_variable(|| value(i))?
            };
            // x * x = next - c
            cs.enforce_constraint(lc!() + x, lc!() + x, lc!() + next - (self.c, Variable::One))?;
            x = next;
        }
        Ok(())
    }
}

enum Command {
    Run { constraints: usize },
    Help,
}

fn parse_args(mut args: impl Iterator<Item = String>) -> Result<Command, String> {
    let mut constraints = DEFAULT_CONSTRAINTS;
    while let Some(arg) = args.next() {
        let value = match arg.as_str() {
            "-h" | "--help" => return Ok(Command::Help),
            "--constraints" => args.next().ok_or("--constraints needs a value")?,
            _ => match arg.strip_prefix("--constraints=") {
                Some(value) => value.to_owned(),
                None => return Err(format!("unknown argument '{arg}' (try --help)")),
            },
        };
        constraints = match value.parse::<usize>() {
            Ok(n) if n >= 1 => n,
            _ => {
                return Err(format!(
                    "--constraints: expected an integer >= 1, got '{value}'"
                ))
            }
        };
    }
    Ok(Command::Run { constraints })
}

fn prove_and_verify(constraints: usize) -> Result<bool, SynthesisError> {
    // Seeded, so runs of the same size do the same work.
    let mut rng = StdRng::seed_from_u64(0);
    let c = Fr::from(7u64);
    let x0 = Fr::rand(&mut rng);
    let public_output = *chain(x0, c, constraints)
        .last()
        .expect("chain is never empty");

    let setup_circuit = SquareChain {
        x0: None,
        c,
        steps: constraints,
    };
    let prove_circuit = SquareChain {
        x0: Some(x0),
        ..setup_circuit.clone()
    };

    let setup = start_timer!(|| "Setup");
    let pk = Groth16::<Bn254>::generate_random_parameters_with_reduction(setup_circuit, &mut rng)?;
    end_timer!(setup);

    let prove = start_timer!(|| "Prove");
    let proof = Groth16::<Bn254>::create_random_proof_with_reduction(prove_circuit, &pk, &mut rng)?;
    end_timer!(prove);

    let verify = start_timer!(|| "Verify");
    let pvk = prepare_verifying_key(&pk.vk);
    let ok = Groth16::<Bn254>::verify_proof(&pvk, &proof, &[public_output])?;
    end_timer!(verify);

    Ok(ok)
}

fn main() -> ExitCode {
    let constraints = match parse_args(std::env::args().skip(1)) {
        Ok(Command::Run { constraints }) => constraints,
        Ok(Command::Help) => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(message) => {
            eprintln!("arkworks-prover: {message}");
            return ExitCode::from(2);
        }
    };

    let total = start_timer!(|| "arkworks-prover");
    let result = prove_and_verify(constraints);
    end_timer!(total);

    match result {
        Ok(true) => {
            eprintln!("arkworks-prover: Groth16/BN254 proof verified ({constraints} constraints)");
            ExitCode::SUCCESS
        }
        Ok(false) => {
            eprintln!("arkworks-prover: proof did not verify ({constraints} constraints)");
            ExitCode::from(1)
        }
        Err(error) => {
            eprintln!("arkworks-prover: {error}");
            ExitCode::from(1)
        }
    }
}
