pragma circom 2.0.0;

// Inner product of two private 64-vectors; the result is public.
template InnerProduct(n) {
    signal input a[n];
    signal input b[n];
    signal output out;
    signal acc[n + 1];
    acc[0] <== 0;
    for (var i = 0; i < n; i++) {
        acc[i + 1] <== acc[i] + a[i] * b[i];
    }
    out <== acc[n];
}

// 500 terms: a 1024-point domain, so every phase takes long enough (ms) to be timed by
// line arrival; the powers of tau it needs (2^10) take about 3 s to make.
component main = InnerProduct(500);
