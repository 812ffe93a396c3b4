/* A JPEG file's window, read and decoded without the GIL: the C interface between _jpeg (which links libjpeg-turbo)
 * and _native (the op runner), so that one sample's file read, decode, operations and tensor tail are one call with
 * the GIL released once (module.c's run_ops_file). _jpeg hands out the functions in a capsule (`_jpeg.file_api`);
 * _native never links libjpeg, so a machine without it loses only this path.
 */
#ifndef NANO_JPEG_FILE_H
#define NANO_JPEG_FILE_H

#include <stddef.h>

#define NANO_JPEG_FILE_CAPSULE "nano_patch.vision._jpeg.file_api"
#define NANO_JPEG_FILE_ABI 1

/* What load() did: decoded the window (OK); could not read the file (UNREAD: the caller reads it itself, and meets
 * the error its own way); read it but left it to the caller (REFUSED: data/size hold its bytes, `why` says why:
 * not the expected size, truncated, not a JPEG region-decoded here, a window outside the image, damage); no memory. */
enum { NANO_JPEG_OK = 0, NANO_JPEG_UNREAD, NANO_JPEG_REFUSED, NANO_JPEG_NOMEM };

typedef struct {
    /* the request */
    const char *path;
    long long expect_h, expect_w;        /* the size the draw used: anything else is REFUSED */
    long long top, left, height, width;  /* the window */
    int check_rest, allow_multiscan;     /* as decode_region's */
    size_t max_bytes;                    /* larger files are UNREAD (the caller's read decides) */
    /* the result */
    unsigned char *data; /* the file's bytes (malloc'd; kept only where REFUSED) */
    size_t size;
    unsigned char *pixels; /* the decoded block (malloc'd) */
    const unsigned char *window; /* the window's first pixel in it */
    ptrdiff_t stride;      /* bytes from one of its rows to the next */
    char why[240];
} nano_jpeg_file;

typedef struct {
    int abi;
    /* No Python calls: runs without the GIL. Free what it leaves with release(), whatever it returned. */
    int (*load)(nano_jpeg_file *f);
    void (*release)(nano_jpeg_file *f);
} nano_jpeg_file_api;

#endif
