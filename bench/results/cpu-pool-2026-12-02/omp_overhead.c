#include <stdio.h>
#include <omp.h>
#include <time.h>
#include <unistd.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec*1e9+t.tv_nsec;}
volatile long sink;
int main(void){
  int n=200000; double per[5];
  #pragma omp parallel for num_threads(2)
  for(int i=0;i<2;i++) sink+=i;
  for(int r=0;r<5;r++){double t=now();
    for(int k=0;k<n;k++){
      #pragma omp parallel for schedule(static) num_threads(2)
      for(int i=0;i<2;i++) __atomic_fetch_add(&sink,i,__ATOMIC_RELAXED);
    }
    per[r]=(now()-t)/n;}
  for(int i=0;i<5;i++)for(int j=i+1;j<5;j++)if(per[j]<per[i]){double x=per[i];per[i]=per[j];per[j]=x;}
  printf("openmp back to back: %.0f ns per region\n",per[2]);
  double lat[200];
  for(int r=0;r<200;r++){usleep(2000);double t=now();
      #pragma omp parallel for schedule(static) num_threads(2)
      for(int i=0;i<2;i++) __atomic_fetch_add(&sink,i,__ATOMIC_RELAXED);
    lat[r]=now()-t;}
  for(int i=0;i<200;i++)for(int j=i+1;j<200;j++)if(lat[j]<lat[i]){double x=lat[i];lat[i]=lat[j];lat[j]=x;}
  printf("openmp after 2 ms idle: %.0f ns median, %.0f ns p90\n",lat[100],lat[180]);
}
