"""Kernel sources shared by the end-to-end tests of raw kernels (tests/cli/e2e.py
and python/tests/test_ops.py, which finds this folder through conftest.py)."""

# y[i] = alpha * float(z[i]) + i and z[i] *= beta over n elements: a float and a
# double buffer, and int, float and double push constants (needs shaderFloat64).
GLSL_AXPY = """#version 450
layout(local_size_x = 64) in;
layout(std430, binding = 0) buffer BY { float y[]; };
layout(std430, binding = 1) buffer BZ { double z[]; };
layout(push_constant) uniform PC { int n; float alpha; double beta; } pc;
void main() {
  uint i = gl_GlobalInvocationID.x;
  if (i < uint(pc.n)) {
    y[i] = pc.alpha * float(z[i]) + float(i);
    z[i] = z[i] * pc.beta;
  }
}
"""
