// Batched matmul with epilogue, register-blocked: a 64x64 output tile per workgroup, 4x4
// outputs per thread, K in steps of 16 through workgroup memory. Operands are read in place
// through their strides (transposed and broadcast views included).
// Parameters: p[0] M, p[1] N, p[2] K, p[3] batch, p[4] batch rank BR,
// p[5] a offset, p[6] a row stride, p[7] a k stride, p[8] b offset, p[9] b k stride,
// p[10] b column stride, p[11] bias offset, p[12] bias stride, p[13] residual offset,
// p[14] residual row stride, p[15] residual column stride, p[16] output offset,
// then batch shape, a, b and residual batch strides (BR each).

var<workgroup> ta: array<f32, 1024>;
var<workgroup> tb: array<f32, 1024>;

// @kernel matmul
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let m = p[0];
    let n = p[1];
    let kk_total = p[2];
    let batch = p[3];
    let br = p[4];
    let tiles_m = (m + 63u) / 64u;
    let tiles_n = (n + 63u) / 64u;
    let tr = lid / 16u;
    let tc = lid % 16u;
    for (var z = wid.z; z < batch; z += nwg.z) {
        let a_base = p[5] + strided(z, br, 17u, 17u + br);
        let b_base = p[8] + strided(z, br, 17u, 17u + 2u * br);
        let r_base = p[13] + strided(z, br, 17u, 17u + 3u * br);
        let o_base = p[16] + z * m * n;
        for (var ty = wid.y; ty < tiles_m; ty += nwg.y) {
            for (var tx = wid.x; tx < tiles_n; tx += nwg.x) {
                let m0 = ty * 64u;
                let n0 = tx * 64u;
                var acc: array<f32, 16>;
                for (var q = 0u; q < 16u; q++) { acc[q] = 0.0; }
                for (var k0 = 0u; k0 < kk_total; k0 += 16u) {
                    for (var e = lid; e < 1024u; e += WG) {
                        let mm = e / 16u;
                        let kk = e % 16u;
                        let gm = m0 + mm;
                        let gk = k0 + kk;
                        var v = 0.0;
                        if (gm < m && gk < kk_total) { v = ld1(a_base + gm * p[6] + gk * p[7]); }
                        ta[kk * 64u + mm] = v;
                    }
                    for (var e = lid; e < 1024u; e += WG) {
                        let kk = e / 64u;
                        let nn = e % 64u;
                        let gn = n0 + nn;
                        let gk = k0 + kk;
                        var v = 0.0;
                        if (gn < n && gk < kk_total) { v = ld2(b_base + gk * p[9] + gn * p[10]); }
                        tb[kk * 64u + nn] = v;
                    }
                    workgroupBarrier();
                    for (var kk = 0u; kk < 16u; kk++) {
                        var av: array<f32, 4>;
                        var bv: array<f32, 4>;
                        for (var i = 0u; i < 4u; i++) {
                            av[i] = ta[kk * 64u + tr + 16u * i];
                            bv[i] = tb[kk * 64u + tc + 16u * i];
                        }
                        for (var i = 0u; i < 4u; i++) {
                            for (var j = 0u; j < 4u; j++) {
                                acc[i * 4u + j] += av[i] * bv[j];
                            }
                        }
                    }
                    workgroupBarrier();
                }
                for (var i = 0u; i < 4u; i++) {
                    for (var j = 0u; j < 4u; j++) {
                        let gm = m0 + tr + 16u * i;
                        let gn = n0 + tc + 16u * j;
                        if (gm < m && gn < n) {
                            var v = acc[i * 4u + j];
                            EPILOGUE
                            STORE(o_base + gm * n + gn, v);
                        }
                    }
                }
            }
        }
    }
}
