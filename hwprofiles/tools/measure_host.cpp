// Measures the numbers of hwprofiles/cpu.yaml on the machine it runs on:
//  - host memory bandwidth: STREAM-style triad a[i] = b[i] + s*c[i] over arrays far larger than the
//    last-level cache, all cores (McCalpin's STREAM counts 3 arrays x 8 bytes per element for triad);
//  - loopback TCP bandwidth and one-way latency between two threads (Gloo's TCP transport
//    runs over such a socket when every rank is on this machine);
//  - single-precision GEMM rate with Eigen at a few sizes (a proxy for the CPU BLAS PyTorch uses).
// Build: g++ -O3 -march=native -fopenmp -I/usr/include/eigen3 measure_host.cpp -o measure_host -lpthread
// It is a tool, not part of the build; its output is quoted in the profile's comments.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <Eigen/Dense>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

using Clock = std::chrono::steady_clock;
static double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

static void triad() {
  const size_t n = size_t(1) << 26;  // 64 Mi doubles per array = 512 MiB each
  std::vector<double> a(n), b(n, 1.0), c(n, 2.0);
  double best = 0;
  for (int rep = 0; rep < 5; ++rep) {
    auto t0 = Clock::now();
#pragma omp parallel for
    for (size_t i = 0; i < n; ++i) a[i] = b[i] + 3.0 * c[i];
    double t = seconds_since(t0);
    best = std::max(best, 3.0 * 8.0 * n / t);
  }
  std::printf("triad_bytes_per_s %.4g (check %g)\n", best, a[n / 2]);
}

static void loopback() {
  int srv = socket(AF_INET, SOCK_STREAM, 0);
  int one = 1;
  setsockopt(srv, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  bind(srv, (sockaddr*)&addr, sizeof addr);
  socklen_t len = sizeof addr;
  getsockname(srv, (sockaddr*)&addr, &len);
  listen(srv, 1);
  const size_t chunk = 4 << 20;
  const int chunks = 256;  // 1 GiB streamed
  const int pings = 20000;
  std::thread peer([&] {
    int s = socket(AF_INET, SOCK_STREAM, 0);
    setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    connect(s, (sockaddr*)&addr, sizeof addr);
    std::vector<char> buf(chunk);
    for (int i = 0; i < chunks; ++i) {
      size_t done = 0;
      while (done < chunk) done += send(s, buf.data() + done, chunk - done, 0);
    }
    char b = 0;
    for (int i = 0; i < pings; ++i) {
      recv(s, &b, 1, MSG_WAITALL);
      send(s, &b, 1, 0);
    }
    close(s);
  });
  int c = accept(srv, nullptr, nullptr);
  setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  std::vector<char> buf(chunk);
  auto t0 = Clock::now();
  for (int i = 0; i < chunks; ++i) {
    size_t done = 0;
    while (done < chunk) {
      ssize_t r = recv(c, buf.data() + done, chunk - done, 0);
      if (r <= 0) return;
      done += r;
    }
  }
  double t = seconds_since(t0);
  std::printf("loopback_bytes_per_s %.4g\n", double(chunk) * chunks / t);
  char b = 1;
  t0 = Clock::now();
  for (int i = 0; i < pings; ++i) {
    send(c, &b, 1, 0);
    recv(c, &b, 1, MSG_WAITALL);
  }
  t = seconds_since(t0);
  std::printf("loopback_one_way_latency_s %.4g\n", t / pings / 2);
  peer.join();
  close(c);
  close(srv);
}

static void gemm() {
  for (int n : {64, 128, 256, 512, 1024, 2048}) {
    Eigen::MatrixXf a = Eigen::MatrixXf::Random(n, n), b = Eigen::MatrixXf::Random(n, n), c(n, n);
    c.noalias() = a * b;  // warm-up
    int reps = std::max(1, int(2e9 / (2.0 * n * n * n)));
    auto t0 = Clock::now();
    for (int r = 0; r < reps; ++r) c.noalias() = a * b;
    double t = seconds_since(t0) / reps;
    std::printf("gemm n=%d flops_per_call %.4g flops_per_s %.4g\n", n, 2.0 * n * n * n, 2.0 * n * n * n / t);
  }
}

int main() {
  triad();
  loopback();
  gemm();
}
