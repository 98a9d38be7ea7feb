// A fork child's set-up, from the fork until it has attached to its sandbox's agent, in one foreign call; and,
// since an interpreter loads this library anyway, the CRC-32C it checks a resumed session with (at the end).
//
// The interpreter loop (internal/agent/repl.py, _fork) forks the parent interpreter once per child; each child
// calls ramify_fork_child before it runs any Python code of its own. In Python the same steps wrote to ~180
// pages of the parent's heap that the child then had to copy (reference counts of the modules, functions and
// objects they touch, ctypes' machinery, /proc/self/maps parsed into Python objects): ~0.7 MiB of private memory
// and ~215 page faults per child, on the path of every fork. Here they touch nothing but this call's stack and
// buffers of its own (~0.1 MiB, ~35 faults): a numpy parent's child's interpreter holds 1.8 MiB of its own after
// its first run_code instead of 2.2.
//
// Freestanding: raw system calls, no C library (the child of a multi-threaded process may find any lock of the
// library's held by a thread that did not come along), no allocation but mmap. x86-64 Linux only, as ramify is.
//
// What it does, in order (each step as repl.py did it before, and as docs/security.md "Fork siblings" says):
//   1. close every descriptor but those the child keeps (its rebuilt files, its five set-up descriptors, 0-2, its
//      parent's agent socket until it has its own): one another thread of the parent opened as it forked is the
//      parent's, whatever it is;
//   2. wait until the server has moved it into its sandbox's cgroups (one byte on the "moved" pipe);
//   3. take the sandbox's group (setresgid), which the seccomp supervisor allows only in the sandbox's cgroup;
//   4. join the sandbox's IPC, UTS, network and mount namespaces (mount last), then its working directory;
//   5. make every descriptor its own, at the same number: re-opened by path in its own file system, copied into
//      a memfd (a deleted file, a memfd), or /dev/null in place of the parent's sockets, pipes and the rest;
//   6. make every MAP_SHARED mapping its own: re-mapped from its own copy of the file, or copied into new shared
//      memory moved over the old (anonymous, SysV or POSIX shared memory, memfds, deleted files); an image
//      file's is left as it is (nothing can change an image file);
//   7. connect to its agent's socket, send attach_repl with its one-time token, and take the stdout and stderr
//      pipes that come with the agent's answer as fd 1 and 2.
//
// The input is a blob repl.py packs in the parent before the fork (_ForkHelper.blob); the answer goes to out.
// Built by scripts/build-forkchild into forkchild_amd64.so, which the agent embeds (TestForkChildHelperIsCurrent
// checks that it was built from this source).

#include <stddef.h>
#include <stdint.h>
#include <asm/unistd.h>
#include <asm/stat.h>
#include <asm/fcntl.h>
#include <asm/mman.h>
#include <linux/mman.h>
#include <linux/errno.h>

#ifndef __x86_64__
#error "ramify's fork child helper is written for x86-64"
#endif

#define EXPORT __attribute__((visibility("default")))

// scripts/build-forkchild defines it as the SHA-256 of this file; TestForkChildHelperIsCurrent finds it.
#ifndef RAMIFY_SOURCE_SHA256
#define RAMIFY_SOURCE_SHA256 "unknown"
#endif
EXPORT const char ramify_fork_child_source[] = "ramify-fork-child-source-sha256:" RAMIFY_SOURCE_SHA256;

// Return codes, as repl.py reports and exits with them.
enum {
	FAILED = 70,       // a step failed: out holds its errno and what it was doing
	REFUSED = 71,      // the agent refused the attach: out holds its answer
	NOT_MOVED = 72,    // the fork was abandoned (no "moved" byte), or the supervisor refused the group
};

static inline long sys6(long n, long a, long b, long c, long d, long e, long f)
{
	long ret;
	register long r10 __asm__("r10") = d;
	register long r8 __asm__("r8") = e;
	register long r9 __asm__("r9") = f;
	__asm__ volatile("syscall"
			 : "=a"(ret)
			 : "a"(n), "D"(a), "S"(b), "d"(c), "r"(r10), "r"(r8), "r"(r9)
			 : "rcx", "r11", "memory");
	return ret;
}

#define sys3(n, a, b, c) sys6(n, (long)(a), (long)(b), (long)(c), 0, 0, 0)

// Calls that may block are retried when a signal interrupts them (repl.py's os calls did the same, PEP 475).
static long sys_retry(long n, long a, long b, long c, long d, long e, long f)
{
	long r;
	do
		r = sys6(n, a, b, c, d, e, f);
	while (r == -EINTR);
	return r;
}

static void copy(void *dst, const void *src, size_t n)
{
	__asm__ volatile("rep movsb" : "+D"(dst), "+S"(src), "+c"(n) : : "memory");
}

// The compiler may emit calls to these for struct copies and initializers.
void *memcpy(void *dst, const void *src, size_t n)
{
	copy(dst, src, n);
	return dst;
}

void *memset(void *dst, int c, size_t n)
{
	void *d = dst;
	__asm__ volatile("rep stosb" : "+D"(d), "+c"(n) : "a"(c) : "memory");
	return dst;
}

// Writes v (>= 0) in decimal at p; returns the number of digits.
static size_t decimal(char *p, long v)
{
	char digits[20];
	size_t n = 0, i = 0;
	do
		digits[n++] = (char)('0' + v % 10);
	while ((v /= 10) > 0);
	while (n)
		p[i++] = digits[--n];
	return i;
}

static size_t slen(const char *s)
{
	size_t n = 0;
	while (s[n])
		n++;
	return n;
}

// ---- the answer ----------------------------------------------------------------------------------------------
// out: i32 the child's agent socket, i32 1 if fd 1 and 2 are now its agent's pipes, i32 errno, u32 n, then n
// bytes: on success what the agent sent (its answer's line and anything after it), on failure what failed.

struct answer {
	uint8_t *out;
	size_t cap;
};

static void put_i32(struct answer *a, size_t at, int32_t v)
{
	copy(a->out + at, &v, 4);
}

static int fail(struct answer *a, int code, long err, const char *what, const char *detail, size_t dlen)
{
	size_t n = slen(what), room = a->cap - 16;
	if (n > room)
		n = room;
	copy(a->out + 16, what, n);
	if (detail && n + 2 + dlen <= room) {
		copy(a->out + 16 + n, ": ", 2);
		copy(a->out + 18 + n, detail, dlen);
		n += 2 + dlen;
	}
	put_i32(a, 8, (int32_t)-err);
	put_i32(a, 12, (int32_t)n);
	return code;
}

// ---- the blob --------------------------------------------------------------------------------------------------

struct blob {
	const uint8_t *p, *end;
	int bad;
};

static const uint8_t *take(struct blob *b, size_t n)
{
	if (b->bad || (size_t)(b->end - b->p) < n) {
		b->bad = 1;
		return 0;
	}
	const uint8_t *at = b->p;
	b->p += n;
	return at;
}

// A little-endian number of n bytes (4 or 8); 0 past the end.
static uint64_t num(struct blob *b, size_t n)
{
	uint64_t v = 0;
	const uint8_t *at = take(b, n);
	if (at)
		copy(&v, at, n);
	return v;
}

#define u32(b) ((uint32_t)num(b, 4))
#define u64(b) num(b, 8)

// A length-prefixed string, copied NUL-terminated into buf (PATH_MAX); 0 if it does not fit.
static const char *str(struct blob *b, char *buf, size_t cap, size_t *len)
{
	uint32_t n = u32(b);
	const uint8_t *at = take(b, n);
	if (!at || n >= cap)
		return 0;
	copy(buf, at, n);
	buf[n] = 0;
	if (len)
		*len = n;
	return buf;
}

#define PATH_CAP 4097

// ---- 1. descriptors the child does not keep ---------------------------------------------------------------------

static void close_from(unsigned lo, unsigned hi)
{
	if (lo > hi)
		return;
	if (sys3(__NR_close_range, lo, hi, 0) == 0)
		return;
	// No close_range (an old kernel): one by one, up to the descriptor limit.
	struct {
		uint64_t cur, max;
	} lim = {1024, 1024};
	sys6(__NR_prlimit64, 0, 7 /* RLIMIT_NOFILE */, 0, (long)&lim, 0, 0);
	uint64_t top = hi < lim.cur ? hi : lim.cur - 1;
	for (uint64_t fd = lo; fd <= top; fd++)
		sys3(__NR_close, fd, 0, 0);
}

// ---- 5. descriptors made the child's own --------------------------------------------------------------------

#define COPY_MAX (64L << 20) // a deleted file or memfd up to this size is copied into a child (repl.py _COPY_MAX)
#define O_PATH_ 010000000

// A new descriptor (mode of flags) on a memfd holding a copy of regular file fd, or -1.
static long copy_file(int fd, int flags)
{
	struct stat st;
	if ((flags & O_PATH_) || (flags & O_ACCMODE) == O_WRONLY || sys3(__NR_fstat, fd, &st, 0) < 0 ||
	    st.st_size > COPY_MAX)
		return -1;
	long mfd = sys3(__NR_memfd_create, "ramify-fork-copy", 1 /* MFD_CLOEXEC */, 0);
	if (mfd < 0)
		return -1;
	long nfd = -1;
	long size = 1 << 20;
	uint8_t *buf = (uint8_t *)sys6(__NR_mmap, 0, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if ((unsigned long)buf > -4096UL)
		goto out;
	for (long off = 0;;) {
		long n = sys_retry(__NR_pread64, fd, (long)buf, size, off, 0, 0);
		if (n < 0)
			goto unmap;
		if (n == 0)
			break;
		for (long done = 0; done < n;) {
			long w = sys_retry(__NR_write, mfd, (long)buf + done, n - done, 0, 0, 0);
			if (w <= 0)
				goto unmap;
			done += w;
		}
		off += n;
	}
	char path[40] = "/proc/self/fd/";
	path[14 + decimal(path + 14, mfd)] = 0;
	nfd = sys_retry(__NR_open, (long)path, flags | O_CLOEXEC, 0, 0, 0, 0);
	if (nfd < 0)
		nfd = -1;
unmap:
	sys3(__NR_munmap, buf, size, 0);
out:
	sys3(__NR_close, mfd, 0, 0);
	return nfd;
}

enum { FD_NULL = 0, FD_OPEN = 1, FD_COPY = 2 };

static int rebuild_fds(struct blob *b, struct answer *a)
{
	uint32_t n = u32(b);
	const uint8_t *start = b->p;
	char path[PATH_CAP];
	// Those another thread of the parent closed after they were listed, before the fork, are left alone: looked
	// for before anything is opened here, which could take their numbers (past the first 4096 listed: as each
	// comes).
	uint64_t open_now[4096 / 64] = {0};
	uint32_t listed = n < 4096 ? n : 4096;
	for (uint32_t i = 0; i < n; i++) {
		int32_t fd = (int32_t)u32(b);
		take(b, 4 + 4 + 8); // how, flags, offset
		take(b, u32(b)); // path
		if (b->bad)
			return fail(a, FAILED, -EINVAL, "fork helper: bad descriptor list", 0, 0);
		if (i < listed && sys3(__NR_fcntl, fd, F_GETFD, 0) >= 0)
			open_now[i / 64] |= 1ULL << (i % 64);
	}
	b->p = start;
	long devnull = -1;
	for (uint32_t i = 0; i < n; i++) {
		int32_t fd = (int32_t)u32(b);
		uint32_t how = u32(b);
		int32_t flags = (int32_t)u32(b);
		int64_t pos = (int64_t)u64(b);
		const char *p = str(b, path, sizeof path, 0);
		int open_before = i < listed ? (open_now[i / 64] >> (i % 64)) & 1 : sys3(__NR_fcntl, fd, F_GETFD, 0) >= 0;
		if (!open_before)
			continue;
		long nfd = -1;
		if (how == FD_OPEN && p) {
			nfd = sys_retry(__NR_open, (long)p, flags | O_NOCTTY | O_CLOEXEC, 0, 0, 0, 0);
			if (nfd < 0)
				nfd = -1; // gone in the child's file system: /dev/null takes its place
		} else if (how == FD_COPY) {
			nfd = copy_file(fd, flags);
		}
		if (nfd < 0) {
			if (devnull < 0) {
				devnull = sys_retry(__NR_open, (long)"/dev/null", O_RDWR | O_CLOEXEC, 0, 0, 0, 0);
				if (devnull < 0)
					return fail(a, FAILED, devnull, "open /dev/null", 0, 0);
			}
			nfd = devnull;
		}
		long r = (flags & O_CLOEXEC) ? sys3(__NR_dup3, nfd, fd, O_CLOEXEC) : sys3(__NR_dup2, nfd, fd, 0);
		if (r < 0)
			return fail(a, FAILED, r, "dup2 onto a descriptor of the parent's", 0, 0);
		if (nfd == devnull)
			continue;
		sys3(__NR_close, nfd, 0, 0);
		sys3(__NR_lseek, fd, pos, 0 /* SEEK_SET */); // not seekable (a device, an O_PATH directory): as it is
	}
	if (devnull >= 0)
		sys3(__NR_close, devnull, 0, 0);
	return 0;
}

// ---- 6. shared mappings made the child's own ---------------------------------------------------------------

static int hexval(const char **s, const char *end, uint64_t *v)
{
	uint64_t x = 0;
	const char *p = *s;
	int any = 0;
	for (; p < end; p++) {
		char c = *p;
		int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
		if (d < 0)
			break;
		x = x << 4 | (uint64_t)d;
		any = 1;
	}
	*s = p;
	*v = x;
	return any;
}

static const char *skip_field(const char *p, const char *end)
{
	while (p < end && *p != ' ')
		p++;
	while (p < end && *p == ' ')
		p++;
	return p;
}

static int ends_with(const char *s, size_t n, const char *suffix)
{
	size_t m = slen(suffix);
	if (n < m)
		return 0;
	for (size_t i = 0; i < m; i++)
		if (s[n - m + i] != suffix[i])
			return 0;
	return 1;
}

// One line of /proc/self/maps, "start-end perms offset dev inode   path", made its own if it is MAP_SHARED.
static int unshare_one(const char *line, const char *end, int has_image_dev, uint64_t image_dev, struct answer *a)
{
	const char *p = line;
	uint64_t start, stop, offset;
	if (!hexval(&p, end, &start) || p >= end || *p != '-')
		return 0;
	p++;
	if (!hexval(&p, end, &stop) || p + 6 > end || p[0] != ' ')
		return 0;
	const char *perms = p + 1;
	if (perms[3] != 's' || perms[4] != ' ')
		return 0;
	p = perms + 5;
	if (!hexval(&p, end, &offset))
		return 0;
	p = skip_field(p, end); // offset's trailing spaces
	p = skip_field(p, end); // dev
	p = skip_field(p, end); // inode
	size_t plen = (size_t)(end - p);
	size_t size = stop - start;
	int prot = (perms[0] == 'r' ? PROT_READ : 0) | (perms[1] == 'w' ? PROT_WRITE : 0) |
		   (perms[2] == 'x' ? PROT_EXEC : 0);
	if (plen > 0 && plen < PATH_CAP && p[0] == '/' && !ends_with(p, plen, " (deleted)")) {
		char path[PATH_CAP];
		copy(path, p, plen);
		path[plen] = 0;
		long ffd = sys_retry(__NR_open, (long)path, ((prot & PROT_WRITE) ? O_RDWR : O_RDONLY) | O_CLOEXEC, 0, 0, 0, 0);
		if (ffd >= 0) {
			struct stat st;
			int done = 0;
			if (sys3(__NR_fstat, ffd, &st, 0) == 0 && (st.st_mode & 0170000) == 0100000) {
				// An image file (glibc's gconv cache, say) is left as it is: nothing changes it, a write makes a
				// copy in the layer. Else the child's file is mapped in place of the parent's.
				done = (has_image_dev && st.st_dev == image_dev) ||
				       sys6(__NR_mmap, (long)start, (long)size, prot, MAP_SHARED | MAP_FIXED, ffd, (long)offset) == (long)start;
			}
			sys3(__NR_close, ffd, 0, 0);
			if (done)
				return 0;
		}
	}
	// A copy: new shared memory, filled, then moved over the old mapping.
	long nw = sys6(__NR_mmap, 0, (long)size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if ((unsigned long)nw > -4096UL)
		return fail(a, FAILED, nw, "copy shared mapping", line, (size_t)(end - line));
	if (!(prot & PROT_READ))
		sys3(__NR_mprotect, start, size, prot | PROT_READ);
	copy((void *)nw, (const void *)start, size);
	sys3(__NR_mprotect, nw, size, prot);
	long r = sys6(__NR_mremap, nw, (long)size, (long)size, MREMAP_MAYMOVE | MREMAP_FIXED, (long)start, 0);
	if (r != (long)start)
		return fail(a, FAILED, r < 0 ? r : -EFAULT, "move shared mapping copy", line, (size_t)(end - line));
	return 0;
}

static int unshare_maps(int has_image_dev, uint64_t image_dev, struct answer *a)
{
	// All of /proc/self/maps first, then the changes (as repl.py did): the file is read while nothing moves.
	long cap = 1 << 20;
	char *buf = (char *)sys6(__NR_mmap, 0, cap, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if ((unsigned long)buf > -4096UL)
		return fail(a, FAILED, (long)buf, "read /proc/self/maps", 0, 0);
	long fd = sys_retry(__NR_open, (long)"/proc/self/maps", O_RDONLY | O_CLOEXEC, 0, 0, 0, 0);
	if (fd < 0) {
		sys3(__NR_munmap, buf, cap, 0);
		return fail(a, FAILED, fd, "open /proc/self/maps", 0, 0);
	}
	long len = 0;
	for (;;) {
		if (len == cap) {
			long more = sys6(__NR_mremap, (long)buf, cap, cap * 2, MREMAP_MAYMOVE, 0, 0);
			if ((unsigned long)more > -4096UL) {
				sys3(__NR_close, fd, 0, 0);
				sys3(__NR_munmap, buf, cap, 0);
				return fail(a, FAILED, more, "read /proc/self/maps", 0, 0);
			}
			buf = (char *)more;
			cap *= 2;
		}
		long n = sys_retry(__NR_read, fd, (long)buf + len, cap - len, 0, 0, 0);
		if (n < 0) {
			sys3(__NR_close, fd, 0, 0);
			sys3(__NR_munmap, buf, cap, 0);
			return fail(a, FAILED, n, "read /proc/self/maps", 0, 0);
		}
		if (n == 0)
			break;
		len += n;
	}
	sys3(__NR_close, fd, 0, 0);
	int rc = 0;
	for (const char *line = buf, *end = buf + len; line < end && rc == 0;) {
		const char *nl = line;
		while (nl < end && *nl != '\n')
			nl++;
		rc = unshare_one(line, nl, has_image_dev, image_dev, a);
		line = nl + 1;
	}
	sys3(__NR_munmap, buf, cap, 0);
	return rc;
}

// ---- 7. the attach ------------------------------------------------------------------------------------------

struct iov {
	void *base;
	size_t len;
};

struct msghdr_ {
	void *name;
	int namelen;
	struct iov *iov;
	size_t iovlen;
	void *control;
	size_t controllen;
	int flags;
};

struct cmsghdr_ {
	size_t len;
	int level, type;
};

#define MAX_FDS 253 // as repl.py's _Reader accepted

static long send_all(int fd, const char *p, size_t n)
{
	while (n > 0) {
		long w = sys_retry(__NR_sendto, fd, (long)p, (long)n, 0, 0, 0);
		if (w < 0)
			return w;
		p += w, n -= (size_t)w;
	}
	return 0;
}

static int attach(int old_sock, const char *prefix, size_t plen, struct answer *a)
{
	long s = sys3(__NR_socket, 1 /* AF_UNIX */, 1 /* SOCK_STREAM */ | O_CLOEXEC, 0);
	if (s < 0)
		return fail(a, FAILED, s, "socket", 0, 0);
	struct {
		uint16_t family;
		char path[108];
	} addr = {1, "\0ramify-agent"};
	long r = sys_retry(__NR_connect, s, (long)&addr, 2 + 1 + 12, 0, 0, 0);
	if (r < 0)
		return fail(a, FAILED, r, "connect to the agent", 0, 0);
	sys3(__NR_close, old_sock, 0, 0);
	// {"op": "attach_repl", "token": ..., "pid": <pid>}\n: repl.py made all of it but the pid.
	char msg[512];
	if (plen + 24 > sizeof msg)
		return fail(a, FAILED, -EINVAL, "attach message too long", 0, 0);
	copy(msg, prefix, plen);
	size_t n = plen + decimal(msg + plen, sys3(__NR_getpid, 0, 0, 0));
	msg[n++] = '}';
	msg[n++] = '\n';
	if ((r = send_all((int)s, msg, n)) < 0)
		return fail(a, FAILED, r, "send attach_repl", 0, 0);
	// The answer: one line, and the agent's stdout and stderr pipes with it (SCM_RIGHTS).
	uint8_t *data = a->out + 16;
	size_t cap = a->cap - 16, got = 0;
	int fds[MAX_FDS], nfds = 0;
	union {
		struct cmsghdr_ h;
		uint8_t bytes[sizeof(struct cmsghdr_) + MAX_FDS * 4 + 8];
	} control;
	int line_end = -1;
	while (line_end < 0 && got < cap) {
		struct iov v = {data + got, cap - got};
		struct msghdr_ m = {0, 0, &v, 1, &control, sizeof control, 0};
		long k = sys_retry(__NR_recvmsg, s, (long)&m, 0, 0, 0, 0);
		if (k < 0)
			return fail(a, FAILED, k, "read the agent's answer", 0, 0);
		for (size_t off = 0; off + sizeof(struct cmsghdr_) <= m.controllen;) {
			struct cmsghdr_ *c = (struct cmsghdr_ *)(control.bytes + off);
			if (c->len < sizeof(struct cmsghdr_))
				break;
			if (c->level == 1 /* SOL_SOCKET */ && c->type == 1 /* SCM_RIGHTS */) {
				size_t count = (c->len - sizeof(struct cmsghdr_)) / 4;
				for (size_t i = 0; i < count && nfds < MAX_FDS; i++)
					copy(&fds[nfds++], control.bytes + off + sizeof(struct cmsghdr_) + 4 * i, 4);
			}
			off += (c->len + 7) & ~(size_t)7;
		}
		if (k == 0)
			break;
		for (size_t i = got; i < got + (size_t)k; i++)
			if (data[i] == '\n') {
				line_end = (int)i;
				break;
			}
		got += (size_t)k;
	}
	static const char ok[] = "{\"type\":\"ok\"";
	size_t okn = sizeof ok - 1;
	int accepted = line_end >= (int)okn && (data[okn] == '}' || data[okn] == ',');
	for (size_t i = 0; accepted && i < okn; i++)
		accepted = data[i] == (uint8_t)ok[i];
	if (!accepted) {
		size_t shown = line_end >= 0 ? (size_t)line_end + 1 : got;
		put_i32(a, 8, 0);
		put_i32(a, 12, (int32_t)shown);
		return REFUSED;
	}
	// fd-level output (subprocesses, C code) goes to this sandbox's agent from now on, not to the parent's.
	int piped = 0;
	if (nfds == 2) {
		sys3(__NR_dup2, fds[0], 1, 0);
		sys3(__NR_dup2, fds[1], 2, 0);
		piped = 1;
	}
	for (int i = 0; i < nfds; i++)
		sys3(__NR_close, fds[i], 0, 0);
	put_i32(a, 0, (int32_t)s);
	put_i32(a, 4, piped);
	put_i32(a, 8, 0);
	put_i32(a, 12, (int32_t)got);
	return 0;
}

// ---- the call ---------------------------------------------------------------------------------------------------

#define BLOB_MAGIC 0x314b4652u // "RFK1"

static const long ns_flags[4] = {0x08000000, 0x04000000, 0x40000000, 0x00020000}; // IPC, UTS, net, mount

EXPORT int ramify_fork_child(const uint8_t *in, size_t inlen, uint8_t *out, size_t outlen)
{
	struct answer a = {out, outlen};
	struct blob b = {in, in + inlen, 0};
	if (outlen < 4096)
		return FAILED;
	put_i32(&a, 0, -1);
	put_i32(&a, 4, 0);
	put_i32(&a, 12, 0);
	if (u32(&b) != BLOB_MAGIC)
		return fail(&a, FAILED, -EINVAL, "fork helper: not a set-up blob of this version", 0, 0);
	int32_t old_sock = (int32_t)u32(&b);
	uint32_t gid = u32(&b);
	int32_t ns[4], moved;
	for (int i = 0; i < 4; i++)
		ns[i] = (int32_t)u32(&b);
	moved = (int32_t)u32(&b);
	uint32_t nkeep = u32(&b);
	const uint8_t *keep = take(&b, (size_t)nkeep * 4);
	char cwd[PATH_CAP];
	const char *dir = str(&b, cwd, sizeof cwd, 0);
	uint32_t has_image_dev = u32(&b);
	uint64_t image_dev = u64(&b);
	char prefix[400];
	size_t plen = 0;
	const char *pre = str(&b, prefix, sizeof prefix, &plen);
	if (b.bad || !keep || !pre)
		return fail(&a, FAILED, -EINVAL, "fork helper: bad set-up blob", 0, 0);
	// What is left of the blob is the descriptor list (rebuild_fds).

	// 1. Everything but what the child keeps (sorted, unique).
	long prev = -1;
	for (uint32_t i = 0; i < nkeep; i++) {
		int32_t fd;
		copy(&fd, keep + 4 * i, 4);
		if (fd > prev + 1)
			close_from((unsigned)(prev + 1), (unsigned)fd - 1);
		if (fd > prev)
			prev = fd;
	}
	close_from((unsigned)(prev + 1), ~0U);

	// 2. Moved into the child's cgroups (end of file instead: the fork was abandoned). Blocked in read, a child
	// costs no CPU while it waits.
	uint8_t byte = 0;
	long r = sys_retry(__NR_read, moved, (long)&byte, 1, 0, 0, 0);
	if (r != 1 || byte != 1)
		return fail(&a, NOT_MOVED, 0, "moved", 0, 0);
	sys3(__NR_close, moved, 0, 0);

	// 3. The child sandbox's group: the seccomp supervisor allows it only in the sandbox's cgroup, which proves
	// the move too.
	r = sys3(__NR_setresgid, gid, gid, gid);
	if (r == -EPERM || r == -EACCES)
		return fail(&a, NOT_MOVED, r, "group", 0, 0);
	if (r < 0)
		return fail(&a, FAILED, r, "setresgid", 0, 0);

	// 4. The target's namespaces (mount last), then its working directory.
	static const char *ns_names[4] = {"setns ipc", "setns uts", "setns net", "setns mnt"};
	for (int i = 0; i < 4; i++) {
		r = sys3(__NR_setns, ns[i], ns_flags[i], 0);
		if (r < 0)
			return fail(&a, FAILED, r, ns_names[i], 0, 0);
		sys3(__NR_close, ns[i], 0, 0);
	}
	if (!dir || !*dir || sys3(__NR_chdir, dir, 0, 0) < 0) {
		r = sys3(__NR_chdir, "/", 0, 0);
		if (r < 0)
			return fail(&a, FAILED, r, "chdir /", 0, 0);
	}

	// 5, 6, 7.
	int rc = rebuild_fds(&b, &a);
	if (rc == 0)
		rc = unshare_maps((int)has_image_dev, image_dev, &a);
	if (rc == 0)
		rc = attach(old_sock, prefix, plen, &a);
	return rc;
}

// ---- CRC-32C of a session stream ----------------------------------------------------------------------------

// A snapshot's parts carry CRC-32C checksums (internal/snapstore Sum); an interpreter that resumes from the stored
// file checks its session as it reads it (repl.py _StreamIn). Python's standard library has no CRC-32C, and its
// one CRC (zlib.crc32, another polynomial) runs at ~0.4 GB/s on the machines we measured: this one uses SSE4.2's
// crc32 instruction (8 bytes a step), a table where the CPU has none. Same arguments and result as Go's
// crc32.Update with the Castagnoli table: crc is the value so far (0 to begin), the result the value after p[:n].

typedef uint64_t __attribute__((may_alias, aligned(1))) u64_unaligned;

static int crc_hw = -1;       // the CPU has SSE4.2 (set at the first call)
static uint32_t crc_table[256]; // the reflected Castagnoli polynomial's byte table, without SSE4.2

static int has_sse42(void)
{
	uint32_t a = 1, b, c = 0, d;
	__asm__ volatile("cpuid" : "+a"(a), "=b"(b), "+c"(c), "=d"(d));
	return (c >> 20) & 1;
}

EXPORT uint32_t ramify_crc32c(uint32_t crc, const uint8_t *p, size_t n)
{
	if (crc_hw < 0) {
		for (uint32_t i = 0; i < 256; i++) {
			uint32_t c = i;
			for (int k = 0; k < 8; k++)
				c = (c >> 1) ^ (0x82f63b78u & -(c & 1));
			crc_table[i] = c;
		}
		crc_hw = has_sse42();
	}
	uint64_t c = ~crc & 0xffffffffu;
	if (!crc_hw) {
		for (; n; n--, p++)
			c = crc_table[(c ^ *p) & 0xff] ^ (c >> 8);
		return ~(uint32_t)c;
	}
	for (; n && ((uintptr_t)p & 7); n--, p++)
		__asm__("crc32b %1, %k0" : "+r"(c) : "rm"(*p));
	for (; n >= 8; n -= 8, p += 8)
		__asm__("crc32q %1, %0" : "+r"(c) : "rm"(*(const u64_unaligned *)p));
	for (; n; n--, p++)
		__asm__("crc32b %1, %k0" : "+r"(c) : "rm"(*p));
	return ~(uint32_t)c;
}
