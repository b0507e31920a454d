/* Gated activations on the CPU in float32: out[t, i] = act(x[t, i]) * x[t, I + i] for x [T, 2I] (a fused gate/up
 * projection). act: 0 = SiLU, 1 = GeLU (tanh approximation), 2 = GeLU (erf). */
#include <math.h>
#include <stdint.h>

void gated_activation(const float *x, int64_t tokens, int64_t inner, int act, float *out) {
    for (int64_t t = 0; t < tokens; t++) {
        const float *gate = x + t * 2 * inner, *up = gate + inner;
        float *o = out + t * inner;
        for (int64_t i = 0; i < inner; i++) {
            float g = gate[i], a;
            if (act == 0) {
                a = g / (1.0f + expf(-g));
            } else if (act == 1) {
                a = 0.5f * g * (1.0f + tanhf(0.7978845608028654f * (g + 0.044715f * g * g * g)));
            } else {
                a = 0.5f * g * (1.0f + erff(g * 0.7071067811865476f));
            }
            o[i] = a * up[i];
        }
    }
}
